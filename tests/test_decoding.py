"""Greedy and beam search against brute force and a plain greedy loop."""

from __future__ import annotations

import itertools

import pytest
import torch

from attnkit.data.tokenizer import BOS, EOS, PAD
from attnkit.decoding import beam_search
from attnkit.models import Seq2Seq, Seq2SeqConfig, TransformerConfig, TransformerEncoderDecoder


def _models():
    torch.manual_seed(1)
    yield Seq2Seq(Seq2SeqConfig(12, 7, embedding_dim=8, hidden_size=8, attention="bahdanau", dropout=0.0)).double().eval()
    yield TransformerEncoderDecoder(TransformerConfig(12, 7, d_model=8, num_heads=2, d_ff=16, encoder_layers=1,
                                                      decoder_layers=1, dropout=0.0)).double().eval()


@torch.no_grad()
def _log_prob(model, source, lengths, tokens: list[int]) -> float:
    """log p(tokens) by teacher forcing; tokens include <eos> unless cut by max_length."""
    target_in = torch.tensor([[BOS, *tokens[:-1]]])
    logits = model(source, lengths, target_in).logits.log_softmax(-1)[0]
    return float(sum(logits[t, token] for t, token in enumerate(tokens)))


@pytest.mark.parametrize("model", list(_models()), ids=["seq2seq", "transformer"])
def test_wide_beam_finds_the_brute_force_best_sequence(rng, model):
    source = torch.randint(4, 12, (1, 5), generator=rng)
    lengths = torch.tensor([5])
    words = [w for w in range(7) if w not in (PAD, BOS)]
    candidates = []
    for n in range(1, 4):  # all outputs of up to 3 tokens: finished ones end in <eos>, the rest are cut
        for seq in itertools.product(words, repeat=n):
            if EOS in seq[:-1] or (n < 3 and seq[-1] != EOS):
                continue
            candidates.append((_log_prob(model, source, lengths, list(seq)), list(seq)))
    best_score, best = max(candidates)
    hyp = beam_search(model, source, lengths, beam_size=len(words) ** 3, max_length=3, length_penalty=0.0)[0]
    assert hyp.tokens + ([EOS] if hyp.finished else []) == best
    assert hyp.score == pytest.approx(best_score, abs=1e-9)


@pytest.mark.parametrize("model", list(_models()), ids=["seq2seq", "transformer"])
def test_beam_one_is_greedy_and_batching_changes_nothing(rng, model):
    source = torch.randint(4, 12, (3, 6), generator=rng)
    lengths = torch.tensor([6, 2, 4])
    hyps = beam_search(model, source, lengths, beam_size=1, max_length=8)
    for b in range(3):
        tokens = []
        for _ in range(8):  # a plain greedy loop by teacher forcing
            logits = model(source[b : b + 1, : lengths[b]], lengths[b : b + 1], torch.tensor([[BOS, *tokens]])).logits
            tokens.append(int(logits[0, -1].argmax()))
            if tokens[-1] == EOS:
                break
        assert hyps[b].tokens + ([EOS] if hyps[b].finished else []) == tokens
        assert hyps[b].weights.shape == (len(tokens), int(lengths[b]))
        torch.testing.assert_close(hyps[b].weights.sum(-1), torch.ones(len(tokens)), rtol=1e-5, atol=1e-5)
    wide = beam_search(model, source, lengths, beam_size=4, max_length=8)
    for b in range(3):
        alone = beam_search(model, source[b : b + 1, : lengths[b]], lengths[b : b + 1], beam_size=4, max_length=8)[0]
        assert alone.tokens == wide[b].tokens
        assert alone.score == pytest.approx(wide[b].score, abs=1e-6)


@pytest.mark.parametrize("model", list(_models()), ids=["seq2seq", "transformer"])
def test_a_reorder_within_each_source_leaves_the_same_state_as_a_full_one(rng, model):
    """Beam search moves rows only among the copies of one source after the first step: the source's
    encoding is not copied then, and the state equals what a full reorder gives."""
    B, K = 3, 4
    source = torch.randint(4, 12, (B, 6), generator=rng)
    lengths = torch.tensor([6, 2, 4])
    states = [model.encode(source, lengths) for _ in range(2)]
    rows = None
    for _ in range(3):
        for state in states:
            if rows is None:
                state.reorder(torch.arange(B).repeat_interleave(K))
            else:
                state.reorder(rows, within_source=state is states[0])
            model.step(state, torch.randint(4, 7, (B * K,), generator=torch.Generator().manual_seed(0)))
        rows = (torch.randint(0, K, (B, K), generator=rng) + torch.arange(B)[:, None] * K).view(-1)

    def tensors(state):
        if hasattr(state, "hidden"):  # Seq2SeqState
            return [state.memory, state.mask, state.keys, state.hidden]
        return [state.memory, state.memory_mask] + [t for pair in state.caches for c in pair for t in (c.keys, c.values)]

    for a, b in zip(tensors(states[0]), tensors(states[1]), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_tiny_top_p_keeps_the_most_likely_token():
    from attnkit.decoding import sample_next

    logits = torch.tensor([[0.1, 3.0, 0.2, 2.9]])
    for _ in range(5):
        assert sample_next(logits, temperature=1.0, top_p=1e-300).item() == 1


def test_float64_logits_are_sampled_in_float64():
    """Two logits 1e-9 apart: equal in float32, so a nucleus of half the mass would be either; in float64 the larger
    alone reaches it."""
    from attnkit.decoding import sample_next

    logits = torch.tensor([[1.0, 1.0 + 1e-9]], dtype=torch.float64)
    assert logits.float()[0, 0] == logits.float()[0, 1]
    for seed in range(20):
        generator = torch.Generator().manual_seed(seed)
        assert sample_next(logits, temperature=1.0, top_p=0.5, generator=generator).item() == 1
