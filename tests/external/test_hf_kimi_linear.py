"""attnkit's native Kimi Linear (``attnkit.models.kimi_linear``) loaded from a checkpoint folder by the one loader:
the same logits as transformers' KimiLinearForCausalLM (a left-padded batch too), the same greedy tokens through its
mixed cache (latent caches for the MLA layers, constant-size states for the Kimi Delta Attention layers), the
original release's layout (``linear_attn_config``, ``block_sparse_moe``, per-expert ``w1/w2/w3``, three
convolutions) read to the same model, and config keys it does not implement refused by name. transformers computes
the delta rule, its norms, gates and router in float32 whatever the model's dtype: with those steps kept in float64
(``hybrid_checks.float64_inside``) the two agree in float64 to 1e-10."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from safetensors.torch import save_file  # noqa: E402

from attnkit.layers import LatentCache, LinearStateCache  # noqa: E402
from attnkit.models.hf_config import UnsupportedConfigError  # noqa: E402
from attnkit.models.kimi_linear import KimiLinearLM  # noqa: E402
from attnkit.models.pretrained import load_hf_folder  # noqa: E402
from attnkit.models.weights import read_checkpoint_folder  # noqa: E402

from float64_checks import assert_float64_logits_equal  # noqa: E402
from hybrid_checks import (  # noqa: E402
    assert_a_call_of_no_token_is_empty,
    assert_same_greedy_tokens,
    assert_same_logits,
    cached_decoding_equals_one_pass,
    ids,
    saved_checkpoint,
    tiny_config,
)


@pytest.fixture(scope="module")
def checkpoint():
    config = tiny_config("kimi_linear")
    theirs, folder = saved_checkpoint(
        lambda: transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager"))
    with torch.no_grad():
        for layer in theirs.model.layers:  # a router bias that changes the choice of experts
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.e_score_correction_bias.copy_(0.1 * torch.randn(8))
    theirs.save_pretrained(folder)
    yield theirs, folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_one_loader_gives_transformers_logits_padded_or_not(checkpoint):
    theirs, folder = checkpoint
    ours = load_hf_folder(folder)
    assert isinstance(ours, KimiLinearLM)
    assert_same_logits(ours, theirs, tol=2e-4)


def test_float64_equals_transformers_to_1e_10_with_its_float32_steps_in_float64(checkpoint):
    theirs, folder = checkpoint
    assert_float64_logits_equal(load_hf_folder(folder, dtype=torch.float64), theirs)


def test_float64_and_decoding_through_the_mixed_cache_equal_one_whole_pass(checkpoint):
    """attnkit's own exactness in float64: prefill, then one token at a time and a chunk, through the caches,
    gives the whole pass's logits to 1e-10, the linear layers' state constant in size."""
    _, folder = checkpoint
    cache = cached_decoding_equals_one_pass(load_hf_folder(folder, dtype=torch.float64))
    assert [type(c) for c in cache] == [LinearStateCache, LinearStateCache, LatentCache, LinearStateCache]
    assert cache[2].length == 14 and cache[0].position == 14


def test_greedy_generation_gives_transformers_tokens(checkpoint):
    theirs, folder = checkpoint
    assert_same_greedy_tokens(load_hf_folder(folder), theirs)


def test_the_original_releases_layout_loads_to_the_same_model(checkpoint, tmp_path):
    """transformers converts the original checkpoint on load (its conversion mapping); attnkit reads it as it is:
    the config's linear_attn_config and first_k_dense_replace, block_sparse_moe, experts' w1/w3/w2, the forget
    gate's tensors on the layer, three depthwise convolutions."""
    theirs, folder = checkpoint
    config = json.loads(open(f"{folder}/config.json").read())
    for key in ("layer_types", "mlp_layer_types", "linear_num_heads", "linear_head_dim", "linear_conv_kernel_dim"):
        config.pop(key)
    config.update(linear_attn_config={"full_attn_layers": [3], "kda_layers": [1, 2, 4], "num_heads": 2, "head_dim": 8,
                                      "short_conv_kernel_size": 4}, first_k_dense_replace=1, mla_use_nope=True,
                  moe_router_activation_func="sigmoid", auto_map={"AutoConfig": "configuration_kimi.KimiLinearConfig"})
    (tmp_path / "config.json").write_text(json.dumps(config))
    original = {}
    for name, tensor in read_checkpoint_folder(folder).items():
        name = name.replace(".mlp.", ".block_sparse_moe.") if ".mlp.experts." in name or ".mlp.gate." in name \
            or ".mlp.shared_experts." in name else name
        if name.endswith("experts.gate_up_proj"):
            gate, up = tensor.chunk(2, dim=1)
            for e in range(tensor.shape[0]):
                original[name.replace("gate_up_proj", f"{e}.w1.weight")] = gate[e].contiguous()
                original[name.replace("gate_up_proj", f"{e}.w3.weight")] = up[e].contiguous()
        elif name.endswith("experts.down_proj"):
            for e in range(tensor.shape[0]):
                original[name.replace("down_proj", f"{e}.w2.weight")] = tensor[e].contiguous()
        elif ".self_attn.forget_gate." in name:
            original[name.replace(".forget_gate.", ".")] = tensor
        elif name.endswith("self_attn.conv1d.weight"):
            for part, piece in zip("qkv", tensor.chunk(3, dim=0)):
                original[name.replace("conv1d", f"{part}_conv1d")] = piece.contiguous()
        else:
            original[name] = tensor
    assert any(".block_sparse_moe.experts.0.w1." in n for n in original)
    save_file(original, str(tmp_path / "model.safetensors"))
    ours = load_hf_folder(tmp_path)
    tokens = ids(4)
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens).logits, theirs(tokens).logits, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("key, value", [("sliding_window_everywhere", 8), ("mla_use_nope", False),
                                        ("num_nextn_predict_layers", 1), ("hidden_act", "gelu")])
def test_what_attnkit_does_not_implement_is_refused_by_name(checkpoint, tmp_path, key, value):
    _, folder = checkpoint
    config = json.loads(open(f"{folder}/config.json").read())
    config[key] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(f"{folder}/model.safetensors", tmp_path / "model.safetensors")
    with pytest.raises(UnsupportedConfigError, match=key):
        load_hf_folder(tmp_path)


def test_a_config_without_the_sizes_is_refused_by_name(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "kimi_linear", "vocab_size": 10}))
    with pytest.raises(UnsupportedConfigError, match="missing keys .*hidden_size"):
        load_hf_folder(tmp_path)


def test_a_call_of_no_token_gives_empty_logits_and_leaves_the_caches_as_they_were(checkpoint):
    assert_a_call_of_no_token_is_empty(load_hf_folder(checkpoint[1]))
