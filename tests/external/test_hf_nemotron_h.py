"""What attnkit's native Nemotron-H (``attnkit.models.nemotron_h``) adds to the checks every Mamba-2 model passes
(test_hf_mamba2_hybrids.py): NVIDIA's experts saved one by one, the router kept float32 in bfloat16, the older
pattern key, and config keys refused by name."""

from __future__ import annotations

import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnkit.models.hf_config import UnsupportedConfigError  # noqa: E402
from attnkit.models.nemotron_h import nemotron_h_config_from_hf  # noqa: E402
from attnkit.models.pretrained import load_hf_folder  # noqa: E402

from hybrid_checks import (  # noqa: E402
    assert_same_logits,
    saved_checkpoint,
    tiny_config,
)


@pytest.fixture(scope="module")
def checkpoint():
    config = tiny_config("nemotron_h")
    theirs, folder = saved_checkpoint(lambda: transformers.NemotronHForCausalLM(config))
    yield theirs, folder
    shutil.rmtree(folder, ignore_errors=True)


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
