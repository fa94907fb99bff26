"""MultiHeadAttention against the oracle, against torch.nn.MultiheadAttention, and its KV cache."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from attnkit import KVCache, MultiHeadAttention, masks, reference
from attnkit.layers import RotaryEmbedding

from helpers import assert_close, numpy, randn


def params_of(mha: MultiHeadAttention) -> dict:
    out = {}
    for short, proj in (("q", mha.q_proj), ("k", mha.k_proj), ("v", mha.v_proj), ("o", mha.out_proj)):
        out["W_" + short] = numpy(proj.weight)
        out["b_" + short] = numpy(proj.bias)
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("num_kv_heads", [6, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("backend", ["reference", "sdpa", "tiled"])
def test_matches_the_oracle(backend, num_kv_heads, dtype, rng):
    mha = MultiHeadAttention(48, 6, num_kv_heads, backend=backend).to(dtype)
    x = randn(2, 29, 48, dtype=dtype, generator=rng)
    mask = masks.and_masks(masks.causal(29, 29), masks.padding(torch.tensor([29, 17]), 29))
    result = mha(x, mask=mask, need_weights=True)
    expected, weights = reference.multihead(
        numpy(x), numpy(x), numpy(x), params_of(mha), 6, num_kv_heads, mask=numpy(mask)
    )
    assert_close(result.output, expected, dtype, "output")
    assert_close(result.weights, weights, dtype, "weights")


def test_cross_attention_with_other_key_and_value_sizes(rng):
    mha = MultiHeadAttention(32, 4, kdim=20, vdim=12).double()
    query, key, value = randn(3, 7, 32, dtype=torch.float64, generator=rng), randn(3, 11, 20, dtype=torch.float64, generator=rng), randn(3, 11, 12, dtype=torch.float64, generator=rng)
    result = mha(query, key, value, need_weights=True)
    expected, weights = reference.multihead(numpy(query), numpy(key), numpy(value), params_of(mha), 4)
    assert_close(result.output, expected, torch.float64)
    assert result.weights.shape == (3, 4, 7, 11)


def copy_from_torch(torch_mha: nn.MultiheadAttention, num_heads: int) -> MultiHeadAttention:
    D = torch_mha.embed_dim
    ours = MultiHeadAttention(D, num_heads, kdim=torch_mha.kdim, vdim=torch_mha.vdim)
    with torch.no_grad():
        if torch_mha._qkv_same_embed_dim:
            w_q, w_k, w_v = torch_mha.in_proj_weight.chunk(3)
        else:
            w_q, w_k, w_v = torch_mha.q_proj_weight, torch_mha.k_proj_weight, torch_mha.v_proj_weight
        b_q, b_k, b_v = torch_mha.in_proj_bias.chunk(3)
        for proj, w, b in ((ours.q_proj, w_q, b_q), (ours.k_proj, w_k, b_k), (ours.v_proj, w_v, b_v)):
            proj.weight.copy_(w)
            proj.bias.copy_(b)
        ours.out_proj.weight.copy_(torch_mha.out_proj.weight)
        ours.out_proj.bias.copy_(torch_mha.out_proj.bias)
    return ours


@pytest.mark.parametrize("kdim", [None, 24], ids=["self", "cross-kdim"])
def test_equals_torch_multihead_attention_with_key_padding_mask(kdim, rng):
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(64, 8, batch_first=True, kdim=kdim, vdim=kdim).eval()
    ours = copy_from_torch(theirs, 8).eval()
    query = randn(3, 10, 64, generator=rng)
    key = query if kdim is None else randn(3, 13, kdim, generator=rng)
    S = key.shape[1]
    key_padding_mask = torch.arange(S)[None, :] >= torch.tensor([S, S - 4, 2])[:, None]  # True = ignore
    expected_out, expected_weights = theirs(query, key, key, key_padding_mask=key_padding_mask, need_weights=True)
    result = ours(query, key, key, mask=masks.from_key_padding_mask(key_padding_mask), need_weights=True)
    torch.testing.assert_close(result.output, expected_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(result.weights.mean(dim=1), expected_weights, rtol=1e-5, atol=1e-6)


def test_equals_torch_multihead_attention_with_causal_attn_mask(rng):
    torch.manual_seed(1)
    theirs = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    ours = copy_from_torch(theirs, 4).eval()
    x = randn(2, 9, 32, generator=rng)
    attn_mask = torch.triu(torch.ones(9, 9, dtype=torch.bool), diagonal=1)  # True = not allowed
    expected_out, expected_weights = theirs(x, x, x, attn_mask=attn_mask, average_attn_weights=False)
    result = ours(x, is_causal=True, need_weights=True)
    torch.testing.assert_close(result.output, expected_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(result.weights, expected_weights, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("d_model, num_heads, expected", [(512, 8, 1_048_576), (768, 12, 2_359_296)])
def test_parameter_counts_from_the_literature(d_model, num_heads, expected):
    mha = MultiHeadAttention(d_model, num_heads, bias=False)
    assert sum(p.numel() for p in mha.parameters()) == expected


def test_grouped_query_attention_shrinks_key_value_projections():
    mha = MultiHeadAttention(576, 9, num_kv_heads=3, bias=False)  # SmolLM2-135M's attention
    assert mha.k_proj.weight.shape == (192, 576) and mha.v_proj.weight.shape == (192, 576)
    assert sum(p.numel() for p in mha.parameters()) == 2 * 576 * 576 + 2 * 192 * 576


@pytest.mark.parametrize("rotary", [False, True])
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_incremental_decoding_with_kv_cache_equals_full_forward(num_kv_heads, rotary, rng):
    rope = RotaryEmbedding(8, base=100.0) if rotary else None
    mha = MultiHeadAttention(32, 4, num_kv_heads, rotary=rope).double().eval()
    x = randn(2, 12, 32, dtype=torch.float64, generator=rng)
    full = mha(x, is_causal=True).output
    cache = KVCache()
    prefill = mha(x[:, :5], is_causal=True, cache=cache).output  # a prompt of 5 tokens at once
    steps = [mha(x[:, t : t + 1], is_causal=True, cache=cache).output for t in range(5, 12)]
    incremental = torch.cat([prefill, *steps], dim=1)
    torch.testing.assert_close(incremental, full, rtol=1e-12, atol=1e-12)
    assert len(cache) == 12 and cache.keys.shape == (2, num_kv_heads, 12, 8)


def test_static_cache_reuses_encoder_keys_for_cross_attention(rng):
    mha = MultiHeadAttention(16, 2).double().eval()
    memory = randn(1, 7, 16, dtype=torch.float64, generator=rng)
    queries = randn(1, 3, 16, dtype=torch.float64, generator=rng)
    cache = KVCache(static=True)
    stepwise = [mha(queries[:, t : t + 1], memory, cache=cache).output for t in range(3)]
    torch.testing.assert_close(torch.cat(stepwise, 1), mha(queries, memory).output)
    assert len(cache) == 7


def test_dropout_only_in_training_mode(rng):
    mha = MultiHeadAttention(16, 2, dropout=0.5)
    x = randn(2, 6, 16, generator=rng)
    mha.eval()
    torch.testing.assert_close(mha(x).output, mha(x).output)
    mha.train()
    assert not torch.allclose(mha(x).output, mha(x).output)


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda: MultiHeadAttention(10, 3), "d_model=10, num_heads=3"),
        (lambda: MultiHeadAttention(12, 4, num_kv_heads=3), "num_heads=4, num_kv_heads=3"),
        (lambda: MultiHeadAttention(12, 4, backend="cuda"), "backend"),
        (lambda: MultiHeadAttention(16, 2)(torch.randn(2, 5, 15)), "query must have last dim 16"),
        (lambda: MultiHeadAttention(16, 2)(torch.randn(5, 16)), "query must have 3 dimensions"),
        (lambda: MultiHeadAttention(16, 2)(torch.randn(2, 5, 16), torch.randn(3, 4, 16)), "batch sizes differ"),
        (lambda: MultiHeadAttention(16, 2)(torch.randn(2, 5, 16), mask=torch.ones(5, 4, dtype=torch.bool)), "does not broadcast"),
    ],
)
def test_bad_arguments_raise_with_names(make, words):
    with pytest.raises((ValueError, TypeError)) as info:
        make()
    assert words in str(info.value)


def test_key_mask_is_the_padding_of_the_keys_and_joins_the_mask(rng):
    """key_mask (B, S), True at real keys, equals the same padding given as a (B, 1, 1, S) mask, alone
    or beside another mask, with and without a cache; other shapes and a BlockMask beside it are
    refused by name."""
    mha = MultiHeadAttention(16, 4, num_kv_heads=2).double().eval()
    x = torch.randn(2, 7, 16, dtype=torch.float64, generator=rng)
    real = torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1]])
    padding = real.bool()[:, None, None, :]
    torch.testing.assert_close(mha(x, key_mask=real, is_causal=True).output,
                               mha(x, mask=padding, is_causal=True).output, rtol=0, atol=0)
    causal = masks.causal(7, 7)
    torch.testing.assert_close(mha(x, mask=causal, key_mask=real).output, mha(x, mask=causal & padding).output,
                               rtol=0, atol=0)
    cache = KVCache()
    first = mha(x[:, :4], key_mask=real[:, :4], is_causal=True, cache=cache).output
    second = mha(x[:, 4:], key_mask=real, is_causal=True, cache=cache).output
    torch.testing.assert_close(torch.cat([first, second], 1), mha(x, key_mask=real, is_causal=True).output,
                               rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"key_mask must be boolean \(or 0/1\) of shape \(B, S\) = \(2, 7\)"):
        mha(x, key_mask=real[:, :5])
    blocks = masks.block_mask(masks.causal_mod(), None, None, 7, 7)
    with pytest.raises(ValueError, match="real_tokens_mod"):
        mha(x, mask=blocks, key_mask=real)


def test_hooks_and_replaced_projections_still_run(rng):
    """The layer calls a plain nn.Linear as F.linear; a module with a hook, or a projection replaced by
    another module (a LoRA-style wrapper), is called as a module, and so is every projection while a
    global module hook is registered."""
    layer = MultiHeadAttention(16, 4).double().eval()
    x = torch.randn(1, 5, 16, dtype=torch.float64, generator=rng)
    want = layer(x).output
    seen = []
    handle = layer.q_proj.register_forward_hook(lambda module, args, out: seen.append("q") or out * 2)
    doubled = layer(x).output
    assert seen == ["q"] and not torch.allclose(doubled, want)
    handle.remove()

    class Scaled(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            seen.append("wrapped")
            return self.inner(x)

    layer.v_proj = Scaled(layer.v_proj)
    torch.testing.assert_close(layer(x).output, want, rtol=0, atol=0)
    assert seen[-1] == "wrapped"
    global_handle = torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: seen.append(type(m).__name__))
    try:
        layer(x)
    finally:
        global_handle.remove()
    assert seen.count("Linear") == 4


def test_a_key_mask_changed_in_place_is_read_again(rng):
    mha = MultiHeadAttention(16, 4).double().eval()
    x = torch.randn(1, 6, 16, dtype=torch.float64, generator=rng)
    real = torch.ones(1, 6, dtype=torch.bool)
    first = mha(x, key_mask=real).output
    real[0, 4:] = False
    second = mha(x, key_mask=real).output
    torch.testing.assert_close(second, mha(x, mask=real[:, None, None, :].clone()).output, rtol=0, atol=0)
    assert not torch.allclose(first, second)


def test_rotary_is_a_submodule_that_can_be_replaced_removed_and_pickled():
    """``rotary`` reads the module registry (a property; nn.Module.__getattr__ costs a microsecond a read): set,
    replaced, set to None, deleted, deep-copied and pickled like any submodule, and a wrong value refused."""
    import pickle

    layer = MultiHeadAttention(32, 4)
    assert layer.rotary is None and "rotary" not in dict(layer.named_modules())
    rotary = RotaryEmbedding(8)
    layer.rotary = rotary
    assert layer.rotary is rotary and dict(layer.named_modules())["rotary"] is rotary
    x = torch.randn(1, 5, 32)
    with torch.no_grad():
        rotated = layer(x, is_causal=True).output
        layer.rotary = None
        assert layer.rotary is None
        assert not torch.allclose(layer(x, is_causal=True).output, rotated)  # the rotation is gone from the call
        del layer.rotary
        assert layer.rotary is None
        layer.rotary = rotary
        torch.testing.assert_close(layer(x, is_causal=True).output, rotated, rtol=0, atol=0)
        for copied in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
            assert isinstance(copied.rotary, RotaryEmbedding) and copied.rotary is not rotary
            torch.testing.assert_close(copied(x, is_causal=True).output, rotated, rtol=0, atol=0)
    with pytest.raises(TypeError, match="rotary"):
        layer.rotary = 5
    old = MultiHeadAttention(32, 4)  # as pickled before the property: a None rotary in the instance dict
    state = {**old.__dict__, "_modules": dict(old._modules)}
    del state["_modules"]["rotary"]
    state["rotary"] = None
    fresh = MultiHeadAttention.__new__(MultiHeadAttention)
    fresh.__setstate__(state)
    assert fresh.rotary is None and "rotary" in fresh._modules and "rotary" not in fresh.__dict__
