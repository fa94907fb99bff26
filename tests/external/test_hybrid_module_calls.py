"""The hybrids' submodules (blocks, token mixers, their projections and norms, the mixtures, the final norm and head)
are called without ``nn.Module.__call__`` where that call would add nothing (``called``, ``normalised``,
``project_by_name``), as DecoderLM's are (tests/models/test_module_calls.py): the same numbers (bit for bit on AVX-512: helpers.assert_same_numbers), and a
hook on any of them still runs and its result is used. Tiny Qwen3-Next, Qwen3.5, Kimi Linear and MiniMax-01 models
saved by transformers (``hybrid_checks.tiny_config``), loaded by attnkit's one loader, in float64."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from attnkit.models.pretrained import load_hf_folder  # noqa: E402

from helpers import assert_same_numbers  # noqa: E402
from hybrid_checks import LAYER_TYPES, ids, saved_checkpoint, tiny_config  # noqa: E402

# a submodule of each kind, by its path in attnkit's model (layer 1 is a linear layer in every family)
HOOKED = {
    "qwen3_next": ["layers.1", "layers.1.linear_attn", "layers.1.linear_attn.in_proj_qkvz", "layers.1.linear_attn.norm",
                   "layers.1.input_layernorm", "layers.1.mlp", "layers.1.mlp.gate", "layers.1.mlp.shared_expert",
                   "layers.3.self_attn", "norm", "lm_head"],
    "qwen3_5_text": ["layers.1", "layers.1.linear_attn.in_proj_ba", "layers.1.linear_attn.out_proj",
                     "layers.1.post_attention_layernorm", "layers.1.mlp", "layers.1.mlp.up_proj", "layers.3",
                     "layers.3.self_attn.q_norm", "norm", "lm_head"],
    "kimi_linear": ["layers.1", "layers.1.self_attn", "layers.1.self_attn.k_proj", "layers.1.self_attn.forget_gate",
                    "layers.1.self_attn.forget_gate.f_a_proj", "layers.1.self_attn.o_norm", "layers.1.attn_norm",
                    "layers.1.mlp", "layers.1.mlp.shared", "norm", "lm_head"],
    "minimax": ["layers.1", "layers.1.self_attn", "layers.1.self_attn.qkv_proj", "layers.1.self_attn.norm",
                "layers.1.self_attn.output_gate", "layers.1.post_attention_layernorm", "layers.1.mlp",
                "layers.1.mlp.gate", "layers.1.mlp.experts", "norm", "lm_head"],
}


@pytest.fixture(scope="module", params=list(LAYER_TYPES))
def model(request):
    config = tiny_config(request.param)
    _, folder = saved_checkpoint(lambda: transformers.AutoModelForCausalLM.from_config(config,
                                                                                       attn_implementation="eager"))
    try:
        ours = load_hf_folder(folder).double().eval()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return request.param, ours


def _decoded(model, tokens) -> torch.Tensor:
    """Logits of a prefill of 5 tokens then one token at a time, through the model's caches."""
    cache = model.new_cache()
    with torch.no_grad():
        steps = [model(tokens[:, :5], cache=cache).logits]
        steps += [model(tokens[:, t:t + 1], cache=cache).logits for t in range(5, tokens.shape[1])]
    return torch.cat(steps, dim=1)


def test_the_same_numbers_without_the_module_calls(model):
    _, ours = model
    tokens = ids(4, batch=2, length=8)
    fast = _decoded(ours, tokens)
    handle = nn.modules.module.register_module_forward_pre_hook(lambda module, args: None)  # every call a module's
    try:
        slow = _decoded(ours, tokens)
    finally:
        handle.remove()
    assert_same_numbers(fast, slow)  # a hook on a projection unpacks q, k and v: an ulp apart under AVX2


def test_a_hook_on_any_submodule_still_runs_and_its_result_is_used(model):
    family, ours = model
    tokens = ids(5, batch=1, length=7)
    want = _decoded(ours, tokens)
    for path in HOOKED[family]:
        module = ours.get_submodule(path)
        seen = []

        def shifted(module, args, out, path=path):  # (a shift that differs by channel: a norm after it would undo
            seen.append(path)                         # a scale, a router's softmax a constant shift)
            if isinstance(out, tuple) and not hasattr(out, "_fields"):  # a block's (x, weights)
                return (out[0] + torch.linspace(0, 1, out[0].shape[-1], dtype=out[0].dtype), *out[1:])
            x = out.output if hasattr(out, "_fields") else out  # a mixer's AttentionOutput, or a tensor
            x = x + torch.linspace(0, 1, x.shape[-1], dtype=x.dtype)
            return out._replace(output=x) if hasattr(out, "_fields") else x

        handle = module.register_forward_hook(shifted)
        try:
            got = _decoded(ours, tokens)
        finally:
            handle.remove()
        assert seen and set(seen) == {path}, path  # one call a forward (a prefill and two steps)
        assert not torch.allclose(got, want), path
    torch.testing.assert_close(_decoded(ours, tokens), want, rtol=0, atol=0)  # every hook removed: as before
