"""attnkit's native Nemotron-H (``attnkit.models.nemotron_h``: Mamba-2, softmax attention, squared-ReLU MLP and
mixture-of-experts layers) loaded from a transformers checkpoint by the one loader: the same logits as transformers'
NemotronHForCausalLM (float32, a batch as it is and left-padded; float64 to 1e-10 with transformers' float32 steps
kept in float64), the same greedy tokens (a left-padded batch too), cached decoding equal to one pass, the attention
of every layer that mixes tokens, experts saved one by one, and config keys refused by name."""

from __future__ import annotations

import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnkit.models.hf_config import UnsupportedConfigError  # noqa: E402
from attnkit.models.nemotron_h import NemotronHLM, nemotron_h_config_from_hf  # noqa: E402
from attnkit.models.pretrained import load_hf_folder  # noqa: E402

from float64_checks import assert_float64_logits_equal  # noqa: E402
from hybrid_checks import (  # noqa: E402
    assert_same_greedy_tokens,
    assert_same_logits,
    assert_same_padded_greedy_tokens,
    cached_decoding_equals_one_pass,
    saved_checkpoint,
    tiny_config,
)


@pytest.fixture(scope="module", params=["latent", "plain"])
def checkpoint(request):
    config = tiny_config("nemotron_h", **({} if request.param == "latent" else dict(moe_latent_size=None)))
    theirs, folder = saved_checkpoint(lambda: transformers.NemotronHForCausalLM(config))
    yield theirs, folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_one_loader_gives_transformers_logits_padded_or_not(checkpoint):
    theirs, folder = checkpoint
    ours = load_hf_folder(folder)
    assert isinstance(ours, NemotronHLM)
    assert [block.kind for block in ours.layers] == ["linear_attention", "moe", "full_attention", "mlp",
                                                     "linear_attention"]
    assert_same_logits(ours, theirs, tol=2e-4)


def test_float64_equals_transformers_to_1e_10_with_its_float32_steps_in_float64(checkpoint):
    theirs, folder = checkpoint
    assert_float64_logits_equal(load_hf_folder(folder, dtype=torch.float64), theirs)


def test_greedy_generation_gives_transformers_tokens(checkpoint):
    theirs, folder = checkpoint
    assert_same_greedy_tokens(load_hf_folder(folder), theirs, new=10)


def test_a_left_padded_batch_generates_as_each_prompt_alone_and_as_transformers(checkpoint):
    theirs, folder = checkpoint
    assert_same_padded_greedy_tokens(load_hf_folder(folder), theirs)


def test_cached_decoding_equals_one_pass_and_the_mixing_layers_have_attention(checkpoint):
    _, folder = checkpoint
    ours = load_hf_folder(folder, dtype=torch.float64)
    cached_decoding_equals_one_pass(ours)
    attentions = ours(torch.randint(3, 60, (1, 9)), need_weights=True).attentions
    assert [a is None for a in attentions] == [False, True, False, True, False]
    assert all(a.shape == (1, 4, 9, 9) and (a.triu(1) == 0).all() for a in attentions if a is not None)


def test_experts_saved_one_by_one_load_as_stacked(checkpoint, tmp_path):
    """NVIDIA's checkpoints hold each expert's ``up_proj`` and ``down_proj`` on its own, under ``backbone.``:
    the same tensors so named give the same model."""
    from safetensors.torch import load_file, save_file

    theirs, folder = checkpoint
    published = {}
    for name, tensor in load_file(f"{folder}/model.safetensors").items():
        name = name.replace("model.", "backbone.", 1) if name.startswith("model.") else name
        if name.endswith((".experts.up_proj", ".experts.down_proj")):
            for i, one in enumerate(tensor.unbind(0)):
                published[f"{name}".replace(".experts.", f".experts.{i}.") + ".weight"] = one.clone()
        else:
            published[name] = tensor
    assert any(".experts.3.down_proj.weight" in name for name in published)
    save_file(published, str(tmp_path / "model.safetensors"))
    shutil.copy(f"{folder}/config.json", tmp_path / "config.json")
    assert_same_logits(load_hf_folder(tmp_path), theirs, tol=2e-4)


@pytest.mark.parametrize("change, match", [
    (dict(mlp_hidden_act="gelu"), "mlp_hidden_act"),
    (dict(sliding_window=16), "sliding_window"),
    (dict(n_group=3), "n_group"),
    (dict(layers_block_type=["linear_attention", "conv"]), "layers_block_type"),
    (dict(some_new_key=1), "some_new_key"),
])
def test_what_attnkit_does_not_implement_is_refused_by_name(change, match):
    hf = tiny_config("nemotron_h").to_dict() | change
    with pytest.raises(UnsupportedConfigError, match=match):
        nemotron_h_config_from_hf(hf)


def test_the_pattern_of_older_configs_reads_as_transformers_reads_it():
    hf = tiny_config("nemotron_h").to_dict()
    del hf["layers_block_type"]
    hf["hybrid_override_pattern"] = "M*-EM"
    assert nemotron_h_config_from_hf(hf).layer_types == (
        "linear_attention", "full_attention", "mlp", "moe", "linear_attention")


def test_in_bfloat16_the_router_stays_float32_as_transformers_keeps_it(checkpoint):
    _, folder = checkpoint
    ours = load_hf_folder(folder, dtype="bfloat16")
    router = ours.layers[1].mixer.gate
    assert router.weight.dtype == router.e_score_correction_bias.dtype == torch.float32
    assert ours.embeddings.weight.dtype == torch.bfloat16
    tokens = torch.randint(3, 60, (1, 9))
    torch.testing.assert_close(ours(tokens).logits.float(), load_hf_folder(folder)(tokens).logits, rtol=0.1, atol=0.1)
