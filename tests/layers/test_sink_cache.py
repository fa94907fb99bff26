"""StreamingLLM's sinks + window cache: token-by-token decoding against the definition written
out here, chunked steps against token-by-token, constant memory."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit.layers import KVCache, MultiHeadAttention, RotaryEmbedding, SinkCache
from attnkit.layers.positional import apply_rotary  # noqa: F401  (the rotation used by RotaryEmbedding)
from attnkit.models.config import DecoderConfig
from attnkit.models.decoder import DecoderLM

D, H, HKV = 24, 4, 2


def _layer():
    torch.manual_seed(0)
    return MultiHeadAttention(D, H, HKV, rotary=RotaryEmbedding(D // H), bias=False).double().eval()


def _streaming_reference(layer, x, sinks, window):
    """StreamingLLM by its definition: at step t the cache holds positions 0..sinks-1 and the last
    window - 1 before t, plus t; keys rotated at their index in that list, the query at the last."""
    outputs = []
    q_all = attnkit.functional.split_heads(layer.q_proj(x), H)
    k_all = attnkit.functional.split_heads(layer.k_proj(x), HKV)
    v_all = attnkit.functional.split_heads(layer.v_proj(x), HKV)
    for t in range(x.shape[1]):
        held = sorted(set(range(min(sinks, t + 1))) | set(range(max(0, t - window + 1), t + 1)))
        keys = layer.rotary(k_all[:, :, held], positions=torch.arange(len(held)))
        query = layer.rotary(q_all[:, :, t : t + 1], positions=torch.tensor([len(held) - 1]))
        out = attnkit.attention(query, keys, v_all[:, :, held], backend="reference").output
        outputs.append(layer.out_proj(attnkit.functional.merge_heads(out)))
    return torch.cat(outputs, dim=1)


@pytest.mark.parametrize("sinks, window", [(4, 8), (0, 8), (2, 1), (3, 30)])
def test_token_by_token_equals_streaming_llm_by_definition(sinks, window, rng):
    layer = _layer()
    x = torch.randn(2, 40, D, dtype=torch.float64, generator=rng)
    cache = SinkCache(sinks, window)
    steps = [layer(x[:, t : t + 1], is_causal=True, cache=cache).output for t in range(40)]
    # float64 end to end (positions too): the definition to 1e-12, not the 1e-8 of float32 angles
    torch.testing.assert_close(torch.cat(steps, 1), _streaming_reference(layer, x, sinks, window), rtol=1e-12, atol=1e-12)
    assert cache.length == min(40, sinks + window - 1) and cache.position == 40


@pytest.mark.parametrize("chunks", [[40], [7, 13, 1, 19], [5] * 8, [1, 39]])
def test_chunked_steps_equal_token_by_token(chunks, rng):
    """Several new tokens per step (prompts, chunked scoring) give each query the keys and
    positions it would have had one token at a time; sinks merged by log-sum-exp."""
    layer = _layer()
    x = torch.randn(2, 40, D, dtype=torch.float64, generator=rng)
    expected = _streaming_reference(layer, x, 4, 8)
    cache, start, outputs = SinkCache(4, 8), 0, []
    for size in chunks:
        outputs.append(layer(x[:, start : start + size], is_causal=True, cache=cache).output)
        start += size
    torch.testing.assert_close(torch.cat(outputs, 1), expected, rtol=1e-12, atol=1e-12)


def test_before_any_eviction_it_equals_a_plain_cache(rng):
    layer = _layer()
    x = torch.randn(1, 11, D, dtype=torch.float64, generator=rng)
    plain = layer(x, is_causal=True, cache=KVCache()).output
    sink = layer(x, is_causal=True, cache=SinkCache(4, 8)).output  # 11 <= 4 + 8 - 1: nothing evicted
    torch.testing.assert_close(sink, plain)


def test_a_decoder_lm_scores_past_its_context_in_constant_memory(rng):
    config = DecoderConfig(vocab_size=61, d_model=24, num_layers=2, num_heads=6, num_kv_heads=2, d_ff=40,
                           positional="rope", norm="rmsnorm", mlp="swiglu", bias=False, max_len=16)
    torch.manual_seed(0)
    model = DecoderLM(config).double().eval()
    ids = torch.randint(0, 61, (1, 64), generator=rng)
    with torch.no_grad():
        cache = model.new_cache(sinks=2, window=6)
        one = torch.cat([model(ids[:, t : t + 1], cache=cache).logits for t in range(64)], 1)
        assert all(c.length == 7 for c in cache)
        cache = model.new_cache(sinks=2, window=6)
        chunked = torch.cat([model(ids[:, t : t + 16], cache=cache).logits for t in range(0, 64, 16)], 1)
    torch.testing.assert_close(chunked, one)


def test_misuse_is_refused():
    layer = _layer()
    x = torch.randn(1, 3, D, dtype=torch.float64)
    with pytest.raises(ValueError, match="SinkCache is for causal self attention"):
        layer(x, cache=SinkCache(2, 4))
    with pytest.raises(ValueError, match="window must be a positive int"):
        SinkCache(2, 0)
    gpt2 = DecoderLM(DecoderConfig(vocab_size=61, d_model=24, num_layers=1, num_heads=4, d_ff=40, max_len=64))
    with pytest.raises(ValueError, match="a sinks cache needs rotary positions"):
        gpt2.new_cache(sinks=4, window=8)

