"""What a cache attends, held to the float64 oracle (attnkit.reference's multi-head attention with RoPE)
and to the same layer without a cache: rolling windows, static cross-attention caches with rotary
queries, a batch that does not fit the cache, caches given another sequence's keys; and a sweep over
caches x rotary x grouped heads x dtypes x step sizes (decoding equals the full pass, which equals the
oracle)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from attnkit import KVCache, MultiHeadAttention, reference
from attnkit.layers import FixedKVCache, RotaryEmbedding, SinkCache

from helpers import numpy, randn

TOLERANCE = {torch.float64: 1e-9, torch.float32: 2e-5}


def _params(mha: MultiHeadAttention) -> dict:
    out = {}
    for short, proj in (("q", mha.q_proj), ("k", mha.k_proj), ("v", mha.v_proj), ("o", mha.out_proj)):
        out["W_" + short] = numpy(proj.weight)
        out["b_" + short] = numpy(proj.bias)
    return out


def _oracle(mha: MultiHeadAttention, x, memory=None, *, window=None, causal=True, rotary=False):
    """Float64 multi-head attention written from the formulas (attnkit.reference), RoPE at 0 .. L-1 for the
    queries and 0 .. S-1 for the keys."""
    p = _params(mha)
    x64 = numpy(x)
    kv = x64 if memory is None else numpy(memory)
    H, Hkv, E = mha.num_heads, mha.num_kv_heads, mha.head_dim

    def heads(y, n):
        B, T, width = y.shape
        return y.reshape(B, T, n, width // n).transpose(0, 2, 1, 3)

    q = heads(x64 @ p["W_q"].T + p["b_q"], H)
    k = heads(kv @ p["W_k"].T + p["b_k"], Hkv)
    v = heads(kv @ p["W_v"].T + p["b_v"], Hkv)
    if rotary:
        q = reference.rope(q, np.arange(q.shape[2]))
        k = reference.rope(k, np.arange(k.shape[2]))
    out, _, _ = reference.attention(q, k, v, is_causal=causal and window is None, window=window,
                                    causal_align="bottom-right")
    B, _, L, _ = out.shape
    return out.transpose(0, 2, 1, 3).reshape(B, L, H * E) @ p["W_o"].T + p["b_o"]


def _layer(dtype, num_kv_heads=2, rotary=False, d_model=32, heads=4):
    torch.manual_seed(0)
    rope = RotaryEmbedding(d_model // heads) if rotary else None
    return MultiHeadAttention(d_model, heads, num_kv_heads, rotary=rope).to(dtype)


def _close(got, want, dtype, what=""):
    error = np.abs(numpy(got) - want).max() / max(1.0, np.abs(want).max())
    assert error <= TOLERANCE[dtype], f"{what}: max error {error:.3g}"


def _decode(mha, x, cache, steps, **kwargs):
    outputs, start = [], 0
    for size in steps:
        outputs.append(mha(x[:, start:start + size], is_causal=True, cache=cache, **kwargs).output)
        start += size
    return torch.cat(outputs, dim=1)


# ----------------------------------------------------------------- a rolling cache's window rules
@pytest.mark.parametrize("call_window", [None, 2, 1])
def test_a_rolling_cache_attends_its_window_when_the_call_names_none_or_a_smaller_one(call_window, rng):
    mha = _layer(torch.float64, rotary=True)
    x = randn(2, 9, 32, dtype=torch.float64, generator=rng)
    cache = KVCache(window=2)
    got = _decode(mha, x, cache, [3, 1, 1, 4], window=call_window)
    expected = _oracle(mha, x, window=call_window or 2, rotary=True)
    _close(got, expected, torch.float64, f"window={call_window}")


def test_a_call_window_larger_than_the_rolling_caches_is_refused(rng):
    mha = _layer(torch.float64)
    with pytest.raises(ValueError, match=r"window=3 is larger than this rolling KVCache's window=2"):
        mha(randn(1, 2, 32, dtype=torch.float64, generator=rng), is_causal=True, cache=KVCache(window=2), window=3)


# ------------------------------------------------------------- static caches for cross attention
@pytest.mark.parametrize("steps", [[1] * 6, [2, 1, 3]], ids=["token-by-token", "chunks"])
def test_a_static_cross_attention_cache_rotates_each_steps_queries_at_their_positions(steps, rng):
    """With rotary embeddings each step's queries sit after the steps before (they sat at 0 every step:
    0.077 off), the encoder's keys at 0 .. S-1: the same numbers as the layer without a cache."""
    mha = _layer(torch.float64, rotary=True)
    x, memory = randn(2, 6, 32, dtype=torch.float64, generator=rng), randn(2, 11, 32, dtype=torch.float64, generator=rng)
    cache = KVCache(static=True)
    outputs, start = [], 0
    for size in steps:
        outputs.append(mha(x[:, start:start + size], memory, cache=cache).output)
        start += size
    whole = mha(x, memory).output
    expected = _oracle(mha, x, memory, causal=False, rotary=True)
    _close(whole, expected, torch.float64, "no cache")
    _close(torch.cat(outputs, dim=1), expected, torch.float64, "static cache")
    assert cache.queries == 6
    cache.reset()
    assert cache.queries == 0 and cache.keys is None


def test_a_static_cache_refuses_a_step_of_another_batch(rng):
    mha = _layer(torch.float32)
    memory = randn(2, 5, 32, generator=rng)
    cache = KVCache(static=True)
    mha(randn(2, 1, 32, generator=rng), memory, cache=cache)
    with pytest.raises(ValueError, match=r"filled for batch 2, got a query of batch 1"):
        mha(randn(1, 1, 32, generator=rng), memory[:1], cache=cache)


@pytest.mark.parametrize("make", [lambda: SinkCache(sinks=1, window=4), lambda: FixedKVCache(16)],
                         ids=["SinkCache", "FixedKVCache"])
def test_caches_for_causal_self_attention_refuse_another_sequences_keys(make, rng):
    mha = _layer(torch.float32)
    with pytest.raises(ValueError, match=r"^key: a (SinkCache|FixedKVCache) is for causal self attention.*"
                                         r"KVCache\(static=True\)"):
        mha(randn(1, 1, 32, generator=rng), randn(1, 5, 32, generator=rng), is_causal=True, cache=make())


# ------------------------------------------------------------------------- the named errors
def test_a_float64_query_in_a_float32_layer_is_named(rng):
    mha = _layer(torch.float32)
    with pytest.raises(TypeError, match=r"query has dtype torch.float64 but this MultiHeadAttention's weights are "
                                        r"torch.float32"):
        mha(randn(1, 3, 32, dtype=torch.float64, generator=rng))
    with pytest.raises(TypeError, match=r"key has dtype torch.float64"):
        mha(randn(1, 3, 32, generator=rng), randn(1, 4, 32, dtype=torch.float64, generator=rng))


# ------------------------------------------------------------------------------------ the sweep
SWEEP = list(itertools.product(["growing", "rolling", "fixed"], [False, True], [4, 2, 1], [torch.float64, torch.float32],
                               [[1] * 7, [3, 1, 3], [7]]))


@pytest.mark.parametrize(("kind", "rotary", "kv_heads", "dtype", "steps"), SWEEP,
                         ids=[f"{k}-{'rope' if r else 'plain'}-kv{h}-{str(d)[6:]}-{'+'.join(map(str, s))}"
                              for k, r, h, d, s in SWEEP])
def test_cached_decoding_equals_the_oracle(kind, rotary, kv_heads, dtype, steps, rng):
    mha = _layer(dtype, kv_heads, rotary)
    x = randn(2, sum(steps), 32, dtype=dtype, generator=rng)
    cache = {"growing": KVCache(), "rolling": KVCache(window=3), "fixed": FixedKVCache(12)}[kind]
    window = 3 if kind == "rolling" else None
    expected = _oracle(mha, x, window=window, rotary=rotary)
    _close(mha(x, is_causal=True, window=window).output, expected, dtype, "full pass")
    _close(_decode(mha, x, cache, steps), expected, dtype, "decoded")
