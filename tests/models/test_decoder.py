"""Decoder-only LMs and encoder: parameter counts of the presets, cached decoding equals the full
forward (GQA, RoPE, learned positions, rolling sliding-window cache), generation and sampling."""

from __future__ import annotations

import pytest
import torch

from attnkit.decoding import generate, sample_next
from attnkit.models import count_parameters, preset
from attnkit.models.config import DecoderConfig
from attnkit.models.decoder import DecoderLM
from attnkit.models.encoder import EncoderModel
from attnkit.models.transformer import TransformerEncoder


@pytest.mark.slow
def test_preset_parameter_counts():
    assert count_parameters(DecoderLM(preset("gpt2-small"))) == 124_439_808  # tied embeddings
    assert count_parameters(EncoderModel(preset("bert-base"))) == 109_482_240
    assert count_parameters(DecoderLM(preset("smollm2-135m"))) == 134_515_008
    # The original 6-layer base encoder with bias-free attention: 18,902,016, not "about 25M".
    assert count_parameters(TransformerEncoder(preset("transformer-base", bias=False))) == 18_902_016


CONFIGS = {
    "gpt2": DecoderConfig(vocab_size=61, d_model=24, num_layers=2, num_heads=4, d_ff=40, max_len=64),
    "llama-gqa": DecoderConfig(vocab_size=61, d_model=24, num_layers=2, num_heads=6, num_kv_heads=2, d_ff=40,
                               positional="rope", norm="rmsnorm", mlp="swiglu", bias=False, tie_embeddings=False),
    "mistral-window": DecoderConfig(vocab_size=61, d_model=24, num_layers=2, num_heads=4, num_kv_heads=1, d_ff=40,
                                    positional="rope", norm="rmsnorm", mlp="swiglu", bias=False, window=4),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_incremental_decoding_gives_the_logits_of_a_full_forward(rng, name):
    torch.manual_seed(0)
    model = DecoderLM(CONFIGS[name]).double().eval()
    ids = torch.randint(0, 61, (2, 19), generator=rng)
    full = model(ids).logits
    cache = model.new_cache()
    chunks = [model(ids[:, :6], cache=cache).logits]  # a prompt, then one token at a time
    chunks += [model(ids[:, t : t + 1], cache=cache).logits for t in range(6, 19)]
    torch.testing.assert_close(torch.cat(chunks, 1), full, rtol=1e-10, atol=1e-10)
    if name == "mistral-window":  # rolling cache: constant memory, only the window is held
        assert cache[0].length == 4 and cache[0].position == 19
        assert cache[0]._keys.shape[2] <= 16


def test_sliding_window_ignores_tokens_outside_the_window(rng):
    torch.manual_seed(0)
    model = DecoderLM(CONFIGS["mistral-window"]).double().eval()
    ids = torch.randint(0, 61, (1, 12), generator=rng)
    changed = ids.clone()
    changed[0, 2] = (changed[0, 2] + 1) % 61
    a, b = model(ids).logits, model(changed).logits
    # Two layers of window 4 reach back 2 * (4 - 1) = 6 positions: position 2 no longer matters from 9.
    torch.testing.assert_close(a[:, 9:], b[:, 9:], rtol=0, atol=0)
    assert not torch.allclose(a[:, 2:9], b[:, 2:9])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_generation_with_cache_equals_recomputation(rng, name):
    torch.manual_seed(1)
    model = DecoderLM(CONFIGS[name]).double()
    prompt = torch.randint(0, 61, (2, 5), generator=rng)
    cached = generate(model, prompt, max_new_tokens=12)
    recomputed = generate(model, prompt, max_new_tokens=12, use_cache=False)
    assert torch.equal(cached.tokens, recomputed.tokens)
    seen = []
    sampled = generate(model, prompt, max_new_tokens=12, temperature=0.8, top_k=5, top_p=0.9,
                       generator=torch.Generator().manual_seed(3), on_tokens=seen.append)
    again = generate(model, prompt, max_new_tokens=12, temperature=0.8, top_k=5, top_p=0.9,
                     generator=torch.Generator().manual_seed(3))
    assert torch.equal(sampled.tokens, again.tokens) and torch.equal(torch.stack(seen, 1), sampled.tokens)


def test_stop_tokens_end_each_row():
    torch.manual_seed(2)
    model = DecoderLM(CONFIGS["gpt2"])
    prompt = torch.randint(0, 61, (3, 4), generator=torch.Generator().manual_seed(0))
    free = generate(model, prompt, max_new_tokens=10)
    stop = int(free.tokens[0, 3])
    out = generate(model, prompt, max_new_tokens=10, stop_tokens=[stop])
    first = (free.tokens[0] == stop).nonzero()[0, 0].item()
    assert out.lengths[0] == first + 1 and out.stopped[0]
    assert torch.equal(out.tokens[0, : first + 1], free.tokens[0, : first + 1])


def test_sampling_filters():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    assert sample_next(logits).tolist() == [0]
    draws = {int(sample_next(logits, temperature=1.0, top_k=2, generator=torch.Generator().manual_seed(s))) for s in range(200)}
    assert draws == {0, 1}
    # Probabilities 0.64, 0.24, 0.09, ...: top_p = 0.7 keeps the first two, 0.5 the first one only.
    draws = {int(sample_next(logits, temperature=1.0, top_p=0.7, generator=torch.Generator().manual_seed(s))) for s in range(200)}
    assert draws == {0, 1}
    assert {int(sample_next(logits, temperature=1.0, top_p=0.5, generator=torch.Generator().manual_seed(s))) for s in range(50)} == {0}
    with pytest.raises(ValueError, match="top_p must be in"):
        sample_next(logits, temperature=1.0, top_p=0.0)
