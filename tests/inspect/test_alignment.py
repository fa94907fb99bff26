"""Alignment quality: AER on hand-counted cases, IBM Model 1 on a toy corpus, the diagonal baseline,
piece-to-word pooling, symmetrisation worked by hand, eflomal on a corpus whose alignment is known,
and forced attention alignments (any layer / head, shift-att) from seq2seq models."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from attnkit.data import Pair, Tokenizer, aligned_corpus
from attnkit.inspect.alignment import (
    IBMModel1,
    alignment_error_rate,
    attention_word_weights,
    cross_attention_pieces,
    diagonal_alignment,
    eflomal_align,
    links_from_weights,
    select_weights,
    symmetrize,
    word_weights,
)
from attnkit.models import Seq2Seq, Seq2SeqConfig, TransformerConfig, TransformerEncoderDecoder


def test_aer_precision_recall_counted_by_hand():
    sure = [{(0, 0), (1, 1)}, {(0, 0)}]
    possible = [{(1, 2)}, set()]
    predicted = [{(0, 0), (1, 2), (2, 2)}, {(1, 0)}]
    scores = alignment_error_rate(predicted, sure, possible)
    # |A| = 4, |S| = 3, |A & S| = 1, |A & P| = 2 (P includes S)
    assert scores.precision == pytest.approx(2 / 4) and scores.recall == pytest.approx(1 / 3)
    assert scores.aer == pytest.approx(1 - (1 + 2) / (4 + 3))
    perfect = alignment_error_rate(sure, sure)
    assert perfect.aer == 0 and perfect.precision == perfect.recall == 1
    with pytest.raises(ValueError, match="2 and 1"):
        alignment_error_rate(predicted, sure[:1])


def test_ibm_model1_learns_the_classic_toy_lexicon():
    corpus = [("das haus".split(), "the house".split()), ("das buch".split(), "the book".split()),
              ("ein buch".split(), "a book".split()), ("ein haus".split(), "a house".split())]
    model = IBMModel1().fit(corpus, iterations=20)
    assert np.all(np.diff(model.log_likelihoods) > 0)  # EM never decreases the likelihood
    assert model.probability("house", "haus") > 0.9 and model.probability("the", "das") > 0.9
    assert model.align("das buch".split(), "the book".split()) == {(0, 0), (1, 1)}
    assert model.align("buch das".split(), "the book".split()) == {(1, 0), (0, 1)}  # not positional


def test_diagonal_and_links_from_weights():
    assert diagonal_alignment(2, 4) == {(0, 0), (0, 1), (1, 2), (1, 3)}
    assert diagonal_alignment(3, 3) == {(0, 0), (1, 1), (2, 2)}
    w = np.array([[0.7, 0.2, 0.1], [0.4, 0.35, 0.25], [0.1, 0.1, 0.8]])  # (target, source)
    assert links_from_weights(w) == {(0, 0), (0, 1), (2, 2)}
    assert links_from_weights(w, method="threshold", threshold=0.3) == {(0, 0), (0, 1), (1, 1), (2, 2)}
    assert links_from_weights(w, method="threshold", threshold=0.9) == links_from_weights(w)
    with pytest.raises(ValueError, match="'argmax' or 'threshold'"):
        links_from_weights(w, method="max")


def test_word_weights_sum_source_pieces_and_average_target_pieces():
    pieces = np.array([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]])  # 2 target pieces x 3 source pieces
    words = word_weights(pieces, source_words=[0, 0, 1], target_words=[0, 0])
    assert np.allclose(words, [[(0.75 + 0.2) / 2, (0.25 + 0.8) / 2]])
    with pytest.raises(ValueError, match="need 3 source and 2 target word ids"):
        word_weights(pieces, [0, 1], [0, 0])


def test_tokenizer_word_ids_follow_spaces_not_punctuation():
    tokenizer = Tokenizer.train(["the house is big", "a book, a house"], vocab_size=40)
    text = "the houses, book"
    ids = tokenizer.word_ids(text)
    pieces = tokenizer.tokens(text)
    assert len(ids) == len(pieces) and ids[0] == 0 and ids[-1] == 2
    assert sorted(set(ids)) == [0, 1, 2] and ids == sorted(ids)
    comma = pieces.index(",")
    assert ids[comma] == 1  # "houses," is one space-separated word


def test_forced_attention_alignment_has_one_row_per_target_word():
    pairs = aligned_corpus("valid")[:5]
    source = Tokenizer.train([p.source for p in pairs], vocab_size=120)
    target = Tokenizer.train([p.target for p in pairs], vocab_size=120)
    torch.manual_seed(0)
    model = Seq2Seq(Seq2SeqConfig(source.vocab_size, target.vocab_size, embedding_dim=16, hidden_size=16, attention="bahdanau"))
    out = attention_word_weights(model, source, target, pairs, batch_size=2)
    for pair, w in zip(pairs, out):
        assert w.shape == (len(pair.target.split()), len(pair.source.split()))
        assert np.allclose(w.sum(1), 1.0)  # every target word's attention lies on source words
    with pytest.raises(ValueError, match="no attention"):
        attention_word_weights(Seq2Seq(Seq2SeqConfig(source.vocab_size, target.vocab_size, embedding_dim=8,
                                                     hidden_size=8, attention="none")), source, target, pairs)


def test_bundled_aligned_corpus_is_complete_and_links_are_in_range():
    counts = {split: aligned_corpus(split) for split in ("train", "valid", "test")}
    assert {k: len(v) for k, v in counts.items()} == {"train": 6885, "valid": 154, "test": 880}
    assert sum(len(p.alignment) for v in counts.values() for p in v) == 189_473
    first = counts["train"][0]
    assert first.reference == "40:1:1" and first.source.startswith("Βίβλος γενέσεως")
    assert (0, 0) in first.alignment
    for pair in counts["test"]:
        S, T = len(pair.source.split()), len(pair.target.split())
        assert all(0 <= i < S and 0 <= j < T for i, j in pair.alignment)
    assert {p.reference.split(":")[0] for p in counts["test"]} == {"41", "50", "62"}  # Mark, Philippians, 1 John


# Worked by hand: the intersection is {(0,0), (1,1), (3,3)}; grow-diag adds the union's (1,2),
# (2,2) and (3,4), each next to a link and with a word still unaligned, but not (0,3) (both of its
# words aligned) nor the isolated (5,0) and (6,6); "final" adds (5,0) (source 5 unaligned) and
# (6,6), "final-and" only (6,6), whose words are both unaligned.
FORWARD = {(0, 0), (1, 1), (1, 2), (3, 3), (5, 0), (0, 3)}
REVERSE = {(0, 0), (1, 1), (2, 2), (3, 3), (3, 4), (6, 6)}
GROWN = {(0, 0), (1, 1), (3, 3), (1, 2), (2, 2), (3, 4)}


@pytest.mark.parametrize("method, expected", [
    ("intersection", {(0, 0), (1, 1), (3, 3)}),
    ("union", FORWARD | REVERSE),
    ("grow-diag", GROWN),
    ("grow-diag-final", GROWN | {(5, 0), (6, 6)}),
    ("grow-diag-final-and", GROWN | {(6, 6)}),
])
def test_symmetrize_worked_by_hand(method, expected):
    assert symmetrize(FORWARD, REVERSE, method) == expected
    assert symmetrize(REVERSE, FORWARD, method) == expected  # the heuristics treat both directions alike here
    with pytest.raises(ValueError, match="method must be one of"):
        symmetrize(FORWARD, REVERSE, "grow")


def test_eflomal_recovers_a_known_alignment():
    """A synthetic language pair: each source word has one translation and the target reverses the
    word order, so the true links are known; eflomal, symmetrised, finds them."""
    pytest.importorskip("eflomal", reason="eflomal is in the test extra; without it eflomal_align raises ImportError")
    rng = np.random.default_rng(0)
    vocabulary = [f"s{k}" for k in range(30)]
    pairs, truth = [], []
    for _ in range(400):
        n = int(rng.integers(3, 9))
        source = [vocabulary[k] for k in rng.choice(30, n, replace=False)]
        pairs.append((source, ["t" + w[1:] for w in reversed(source)]))
        truth.append({(i, n - 1 - i) for i in range(n)})
    forward, reverse = eflomal_align(pairs)
    assert len(forward) == len(reverse) == len(pairs)
    for how in ("intersection", "grow-diag-final-and"):
        assert alignment_error_rate([symmetrize(f, r, how) for f, r in zip(forward, reverse)], truth).aer < 0.02, how
    with pytest.raises(ValueError, match="pair 1 has an empty side"):
        eflomal_align([(["a"], ["b"]), ([], ["c"])])


def test_select_weights_picks_layer_head_and_the_shifted_row():
    pieces = np.arange(2 * 3 * 4 * 5, dtype=float).reshape(2, 3, 4, 5)  # (layers, heads, T + 1 = 4, S)
    np.testing.assert_array_equal(select_weights(pieces, layer=0, head=2), pieces[0, 2, :3])
    np.testing.assert_array_equal(select_weights(pieces, layer=-1, head=1, shift=True), pieces[1, 1, 1:])
    np.testing.assert_array_equal(select_weights(pieces), pieces[1].mean(0)[:3])
    for bad, message in (({"layer": 2}, "layer must be in"), ({"head": 3}, "head must be None")):
        with pytest.raises(ValueError, match=message):
            select_weights(pieces, **bad)


def test_cross_attention_pieces_of_a_transformer_are_every_layer_and_head():
    pairs = aligned_corpus("valid")[:4]
    source = Tokenizer.train([p.source for p in pairs], vocab_size=120)
    target = Tokenizer.train([p.target for p in pairs], vocab_size=120)
    torch.manual_seed(0)
    model = TransformerEncoderDecoder(TransformerConfig(source.vocab_size, target.vocab_size, d_model=16, num_heads=4,
                                                        d_ff=32, encoder_layers=1, decoder_layers=3))
    stacks = cross_attention_pieces(model, source, target, pairs, batch_size=3)
    last = attention_word_weights(model, source, target, pairs)
    shifted = attention_word_weights(model, source, target, pairs, layer=0, head=3, shift=True)
    for pair, stack, w, w_shift in zip(pairs, stacks, last, shifted):
        T, S = len(target.encode(pair.target)), len(source.encode(pair.source))
        assert stack.shape == (3, 4, T + 1, S)
        np.testing.assert_allclose(stack.sum(-1), 1.0, atol=1e-6)  # batch padding gets no weight
        # One sentence alone gives the same stack as inside a padded batch.
        alone = cross_attention_pieces(model, source, target, [pair])[0]
        np.testing.assert_allclose(alone, stack, atol=1e-6)
        words = source.word_ids(pair.source), target.word_ids(pair.target)
        np.testing.assert_allclose(w, word_weights(stack[-1].mean(0)[:-1], *words), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(w_shift, word_weights(stack[0, 3, 1:], *words), rtol=1e-5, atol=1e-6)


class _Copier(torch.nn.Module):
    """A seq2seq stand-in whose prediction at target step t reads only source word perm[t]:
    integrated gradients must align target word t to source word perm[t], and nothing else."""

    def __init__(self, vocab: int, perm: list[int]):
        super().__init__()
        torch.manual_seed(0)
        self.source_embedding = torch.nn.Embedding(vocab, 4)
        self.target_embedding = torch.nn.Embedding(vocab, 4)
        self.out = torch.nn.Linear(4, vocab)
        self.perm = perm

    def forward(self, source, source_lengths, target_in):
        x = self.source_embedding(source)  # (B, S, 4)
        steps = target_in.shape[1]
        picked = x[:, [self.perm[min(t, len(self.perm) - 1)] for t in range(steps)]]  # (B, T, 4)
        logits = self.out(torch.tanh(picked) + 0.0 * self.target_embedding(target_in))
        return SimpleNamespace(logits=logits, weights=None)


def test_attribution_alignment_finds_the_word_each_step_reads():
    from attnkit.inspect.alignment import attribution_word_weights

    pair = Pair("a b c d", "w x y z", alignment=((2, 0), (0, 1), (3, 2), (1, 3)))
    source = Tokenizer.train([pair.source], kind="word", vocab_size=20, min_frequency=1)
    target = Tokenizer.train([pair.target], kind="word", vocab_size=20, min_frequency=1)
    model = _Copier(max(source.vocab_size, target.vocab_size), perm=[2, 0, 3, 1])
    (weights,) = attribution_word_weights(model, source, target, [pair], steps=4)
    assert weights.shape == (4, 4)
    np.testing.assert_allclose(weights.sum(1), 1.0)
    assert links_from_weights(weights) == set(pair.alignment)
    assert np.count_nonzero(weights > 1e-12) == 4  # each step's attribution lies on its one source word
