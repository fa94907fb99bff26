"""FixedKVCache (fixed-size storage, columns on the device): prompt + one token at a time equals one
pass over the whole sequence, for learned and rotary positions, GQA and sliding windows; bad use
is refused by name."""

from __future__ import annotations

import pytest
import torch

from attnkit.decoding import generate, pad_prompts
from attnkit.layers import FixedKVCache
from attnkit.models import DecoderConfig, DecoderLM

CONFIGS = {
    "gpt2": dict(positional="learned"),
    "llama-gqa": dict(positional="rope", num_kv_heads=2, norm="rmsnorm", mlp="swiglu", bias=False),
    "mistral-window": dict(positional="rope", num_kv_heads=2, window=3),
}


def _model(kind: str) -> DecoderLM:
    torch.manual_seed(0)
    config = DecoderConfig(vocab_size=50, d_model=32, num_layers=2, num_heads=4, d_ff=64, max_len=64, dropout=0.0,
                           **CONFIGS[kind])
    return DecoderLM(config).double().eval()


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_prompt_then_steps_through_a_fixed_cache_equal_one_pass(rng, kind):
    model = _model(kind)
    ids = torch.randint(0, 50, (2, 12), generator=rng)
    whole = model(ids).logits
    cache = model.new_cache(capacity=16)
    assert all(isinstance(layer, FixedKVCache) for layer in cache)
    pieces = [model(ids[:, :5], cache=cache).logits]
    pieces += [model(ids[:, t : t + 1], cache=cache).logits for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(pieces, 1), whole, rtol=1e-12, atol=1e-12)
    assert int(cache[0].next) == 12 and cache[0].tensors()[0].shape[2] == 16  # storage never grew


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_fixed_cache_generation_equals_the_growing_cache(kind):
    model = _model(kind)
    ids, mask = pad_prompts([[5, 9, 13, 2, 7], [4, 8], [11, 12, 13]])
    want = generate(model, ids, attention_mask=mask, max_new_tokens=10)
    cache = model.new_cache(capacity=ids.shape[1] + 10)
    full_mask = torch.cat([mask, mask.new_ones(3, 10)], 1)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    logits = model(ids, full_mask, cache=cache, position_ids=positions).logits[:, -1]
    got = []
    for _ in range(10):
        token = logits.argmax(-1)
        got.append(token)
        positions = positions[:, -1:] + 1
        logits = model(token[:, None], full_mask, cache=cache, position_ids=positions).logits[:, -1]
    assert torch.equal(torch.stack(got, 1), want.tokens)


def test_fixed_cache_refusals():
    model = _model("llama-gqa")
    with pytest.raises(ValueError, match="capacity"):
        model.new_cache(capacity=0)
    with pytest.raises(ValueError, match="no sinks= or window="):
        model.new_cache(capacity=8, sinks=4)
    with pytest.raises(ValueError, match="max_len"):
        _model("gpt2").new_cache(capacity=65)
    cache = model.new_cache(capacity=4)
    with pytest.raises(ValueError, match="exceed this FixedKVCache's capacity=4"):
        model(torch.zeros(1, 5, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(B, S\) with B = 1, S = 4"):
        model(torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2), cache=model.new_cache(capacity=4))
    with pytest.raises(ValueError, match="is_causal=True"):
        model.layers[0].self_attn(torch.zeros(1, 1, 32, dtype=torch.float64), cache=FixedKVCache(4))
    with pytest.raises(ValueError, match="use_cache=True"):
        generate(model, torch.zeros(1, 2, dtype=torch.long), use_cache=False, compile_step="aot_eager")
    with pytest.raises(TypeError, match="compile_step must be True, False or a torch.compile backend name, got int 1"):
        generate(model, torch.zeros(1, 2, dtype=torch.long), compile_step=1)


def test_reset_and_reorder():
    model = _model("llama-gqa")
    ids, step = torch.tensor([[3, 4, 5], [6, 7, 8]]), torch.tensor([[9], [10]])
    cache = model.new_cache(capacity=6)
    first = model(ids, cache=cache).logits
    storage = [t.data_ptr() for layer in cache for t in layer.tensors()]
    for layer in cache:
        layer.reset()
        assert not any(t.any() for t in layer.tensors())  # zeroed in place, as a new cache
    assert [t.data_ptr() for layer in cache for t in layer.tensors()] == storage
    torch.testing.assert_close(model(ids, cache=cache).logits, first)  # storage reused from column 0
    for layer in cache:
        layer.reorder(torch.tensor([1, 0]))  # as a beam search keeps the second hypothesis first
    reordered = model(step.flip(0), cache=cache).logits
    fresh = model.new_cache(capacity=6)
    model(ids.flip(0), cache=fresh)
    torch.testing.assert_close(reordered, model(step.flip(0), cache=fresh).logits)
