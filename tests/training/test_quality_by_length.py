"""Quality against source length with intervals (training/metrics.py): buckets hold the sentences
their source length says, scores equal sacreBLEU's corpus scores on the bucket, the bootstrap
intervals hold the score, the paired test separates a good system from a bad one, and the
long-over-short BLEU ratio is 1 for a system that holds and near 0 for one that collapses."""

from __future__ import annotations

import random

import pytest

from attnkit.training.metrics import FIGURE2_BUCKETS, bleu_ratio, corpus_scores, quality_by_length

WORDS = "the a of and to in that he for it with as was his on be at by i this had not are but from".split()


def _corpus(seed: int = 0):
    rng = random.Random(seed)
    sources, references = [], []
    for n in [rng.randint(1, 80) for _ in range(400)]:
        sources.append(" ".join(rng.choice(WORDS) for _ in range(n)))
        references.append(" ".join(rng.choice(WORDS) for _ in range(max(1, n + rng.randint(-2, 2)))))
    return sources, references


def _noisy(references, sources, keep_short: float, keep_long: float, seed: int = 1):
    rng = random.Random(seed)
    out = []
    for ref, src in zip(references, sources):
        keep = keep_short if len(src.split()) <= 20 else keep_long
        out.append(" ".join(w if rng.random() < keep else rng.choice(WORDS) for w in ref.split()))
    return out


@pytest.mark.slow
def test_buckets_scores_intervals_and_the_paired_test():
    sources, references = _corpus()
    good = _noisy(references, sources, 0.9, 0.9)
    bad = _noisy(references, sources, 0.3, 0.3, seed=2)
    rows = quality_by_length(sources, {"bad": bad, "good": good}, references, n_samples=200)
    assert [r["bucket"] for r in rows] == [f"{low}-{high}" for low, high in FIGURE2_BUCKETS]
    assert sum(r["sentences"] for r in rows) == len(sources)
    for row in rows:
        picked = [i for i, s in enumerate(sources) if row["low"] <= len(s.split()) <= row["high"]]
        assert row["sentences"] == len(picked)
        for name, hyps in (("bad", bad), ("good", good)):
            cells = row["systems"][name]
            want = corpus_scores([hyps[i] for i in picked], [references[i] for i in picked])
            assert cells["bleu"] == pytest.approx(want.bleu) and cells["chrf"] == pytest.approx(want.chrf, rel=1e-5)
            assert cells["bleu_mean"] - 1.5 * cells["bleu_ci"] <= cells["bleu"] <= cells["bleu_mean"] + 1.5 * cells["bleu_ci"]
            assert cells["bleu_ci"] > 0
        assert row["systems"]["good"]["bleu"] > row["systems"]["bad"]["bleu"]
        assert row["systems"]["good"]["bleu_p"] < 0.05  # paired bootstrap vs the first system
        assert "bleu_p" not in row["systems"]["bad"]


def test_one_system_and_bad_input():
    sources, references = _corpus()
    rows = quality_by_length(sources, {"only": references}, references, buckets=((1, 10),), n_samples=50)
    assert rows[0]["systems"]["only"]["bleu"] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="differ in number"):
        quality_by_length(sources, {"short": references[:-1]}, references)
    with pytest.raises(ValueError, match="systems is empty"):
        quality_by_length(sources, {}, references)


def test_the_long_over_short_ratio_holds_or_collapses():
    sources, references = _corpus()
    holds = bleu_ratio(sources, references, references, n_samples=200)
    assert holds["ratio"] == pytest.approx(1.0) and holds["ratio_low"] == pytest.approx(1.0)
    collapses = bleu_ratio(sources, _noisy(references, sources, 1.0, 0.05), references, n_samples=200)
    assert collapses["ratio"] < 0.2 and collapses["ratio_high"] < 0.5
    assert collapses["long_sentences"] == sum(41 <= len(s.split()) <= 80 for s in sources)
    with pytest.raises(ValueError, match="no sentence with a source of 90-99 words"):
        bleu_ratio(sources, references, references, long=(90, 99))


def test_equal_scores_get_no_p_value():
    """sacreBLEU's paired bootstrap gives two equal systems its smallest p (1 / (n + 1)): a report read it as a
    significant difference. Equal scores in a bucket now give None."""
    from attnkit.training.metrics import quality_by_length

    sources = ["a b c d e f g h i j k l"] * 5
    references = [f"the cat sat on mat {i}" for i in range(5)]
    rows = quality_by_length(sources, {"A": ["q"] * 5, "B": ["w"] * 5}, references, buckets=((11, 20),), n_samples=100)
    assert rows[0]["systems"]["B"]["bleu_p"] is None and rows[0]["systems"]["B"]["bleu"] == 0.0
    rows = quality_by_length(sources, {"A": ["q"] * 5, "B": references}, references, buckets=((11, 20),),
                             n_samples=100)
    assert rows[0]["systems"]["B"]["bleu_p"] is not None and rows[0]["systems"]["B"]["bleu_p"] < 0.05
