"""Qwen3-Next's gated attention and DiffLlama's differential attention: attnkit's layers against
transformers' Qwen3NextAttention and DiffLlamaAttention with copied weights, float64 (1e-10), a full pass
and token-by-token decoding through a KV cache, gradients; the transformers modules' float32 internals
(Qwen3-Next's RMSNorm, eager's softmax) kept in float64 by float64_checks.float64_inside."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers.models.diffllama import modeling_diffllama as diffllama  # noqa: E402
from transformers.models.qwen3_next import modeling_qwen3_next as qwen3_next  # noqa: E402

from attnkit.layers import DifferentialAttention, GatedAttention, KVCache, RotaryEmbedding  # noqa: E402

from float64_checks import float64_inside  # noqa: E402


def _rope(theta: float, dim: int, L: int):
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    emb = torch.cat([torch.arange(L, dtype=torch.float64)[None, :, None] * inv] * 2, dim=-1)
    return emb.cos(), emb.sin()


def _pair(kind: str):
    torch.manual_seed(0)
    if kind == "gated":
        config = transformers.Qwen3NextConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                              partial_rotary_factor=0.25)
        config._attn_implementation = "eager"
        theirs = qwen3_next.Qwen3NextAttention(config, 0)
        ours = GatedAttention(32, 4, 2, head_dim=16, bias=False, norm_eps=config.rms_norm_eps,
                              rotary=RotaryEmbedding(16, config.rope_parameters["rope_theta"], rotary_dim=4))
        rotary_dim = 4
    else:
        config = transformers.DiffLlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
        config._attn_implementation = "eager"
        theirs = diffllama.DiffLlamaAttention(config, 3)
        ours = DifferentialAttention(32, 4, 2, head_dim=8, bias=False, layer=3, norm_eps=config.rms_norm_eps,
                                     rotary=RotaryEmbedding(8, config.rope_parameters["rope_theta"]))
        rotary_dim = 8
    theirs = theirs.double().eval()
    with torch.no_grad():
        for p in theirs.parameters():
            torch.nn.init.normal_(p, std=0.3)
    ours = ours.double()
    ours.load_state_dict({name.replace("o_proj", "out_proj"): t for name, t in theirs.state_dict().items()})
    return theirs, ours, config.rope_parameters["rope_theta"], rotary_dim


@pytest.mark.parametrize("kind", ["gated", "differential"])
def test_the_layer_equals_transformers_module_forward_decoding_and_gradients(kind):
    """transformers' module inside float64_checks.float64_inside (its RMSNorm and eager softmax compute in float32
    otherwise), attnkit's layer outside it."""
    theirs, ours, theta, rotary_dim = _pair(kind)
    B, L = 2, 9
    x = torch.randn(B, L, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    mask = torch.full((L, L), torch.finfo(torch.float64).min, dtype=torch.float64).triu(1)[None, None]
    direction = torch.randn(B, L, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with float64_inside():
        want, _ = theirs(x, _rope(theta, rotary_dim, L), mask)
        (want * direction).sum().backward()
    expected = {name.replace("o_proj", "out_proj"): p.grad.clone() for name, p in theirs.named_parameters()}
    got = ours(x, is_causal=True).output
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    cache = KVCache()
    steps = torch.cat([ours(x[:, i:i + 1], is_causal=True, cache=cache).output for i in range(L)], dim=1)
    torch.testing.assert_close(steps, want, rtol=1e-10, atol=1e-10)
    (got * direction).sum().backward()
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-9, atol=1e-10)


def test_differential_attention_refuses_what_it_cannot_pair():
    with pytest.raises(ValueError, match="must be even"):
        DifferentialAttention(24, 3, 3)
    with pytest.raises(ValueError, match="no attention dropout"):
        DifferentialAttention(32, 4, 2, dropout=0.1)
