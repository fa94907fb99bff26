"""Translation metrics with sacreBLEU: corpus BLEU, chrF, BLEU by source length, and quality by
source length with paired bootstrap intervals (sacreBLEU's significance module)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Scores", "corpus_scores", "bleu_by_length", "LENGTH_BUCKETS", "FIGURE2_BUCKETS", "quality_by_length",
           "bleu_ratio"]

# Source length in words: (low, high) inclusive.
LENGTH_BUCKETS = ((1, 10), (11, 15), (16, 20), (21, 25))


@dataclass(frozen=True)
class Scores:
    bleu: float
    chrf: float
    sentences: int
    signature: str  # sacreBLEU's BLEU signature, for reproducibility


def _of_length(sources: Sequence[str], low: int, high: int) -> list[int]:
    """Indices of the sentences whose source has low..high words (whitespace-separated): the one
    definition of source length behind every bucket here."""
    return [i for i, source in enumerate(sources) if low <= len(source.split()) <= high]


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> Scores:
    """sacreBLEU corpus BLEU (13a tokenisation) and chrF of hypotheses against one reference each."""
    from sacrebleu.metrics import BLEU, CHRF

    if len(hypotheses) != len(references):
        raise ValueError(f"hypotheses and references differ in number: {len(hypotheses)} and {len(references)}")
    if not hypotheses:
        raise ValueError("no sentences to score")
    bleu = BLEU()
    result = bleu.corpus_score(list(hypotheses), [list(references)])
    chrf = CHRF().corpus_score(list(hypotheses), [list(references)])
    return Scores(result.score, chrf.score, len(hypotheses), str(bleu.get_signature()))


def bleu_by_length(
    sources: Sequence[str],
    hypotheses: Sequence[str],
    references: Sequence[str],
    buckets: Sequence[tuple[int, int]] = LENGTH_BUCKETS,
) -> list[dict]:
    """Corpus BLEU of the sentences whose source has low..high words, per bucket (empty buckets skipped)."""
    rows = []
    for low, high in buckets:
        picked = _of_length(sources, low, high)
        if picked:
            scores = corpus_scores([hypotheses[i] for i in picked], [references[i] for i in picked])
            rows.append({"bucket": f"{low}-{high}", "low": low, "high": high, "sentences": len(picked),
                         "bleu": scores.bleu, "chrf": scores.chrf})
    return rows


FIGURE2_BUCKETS = ((1, 10), (11, 20), (21, 30), (31, 40), (41, 50), (51, 80))
"""Source-length buckets (words) of quality against sentence length, as Bahdanau et al. (2015)
plot it: over the test and test-long splits, whose sources run to 80 words."""

BOOTSTRAP_SAMPLES = 1000


def quality_by_length(sources: Sequence[str], systems: Mapping[str, Sequence[str]], references: Sequence[str],
                      buckets: Sequence[tuple[int, int]] = FIGURE2_BUCKETS,
                      n_samples: int = BOOTSTRAP_SAMPLES) -> list[dict]:
    """BLEU and chrF of each system per source-length bucket, with sacreBLEU's paired bootstrap:
    per system the bootstrap mean and 95% interval (mean +- ci), and for every system after the
    first the p-value of its difference from the first (sacreBLEU ``PairedTest``, ``test_type="bs"``,
    seeded by ``SACREBLEU_SEED``, default 12345: the same numbers on every run); None where the two
    score the same (no difference to test: sacreBLEU would give its smallest p). Buckets without
    sentences are skipped."""
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest, Result

    names = list(systems)
    if not names:
        raise ValueError("systems is empty: give at least one name -> hypotheses")
    for name in names:
        if len(systems[name]) != len(references) or len(sources) != len(references):
            raise ValueError(f"sources, references and the hypotheses of {name!r} differ in number: "
                             f"{len(sources)}, {len(references)}, {len(systems[name])}")
    rows = []
    for low, high in buckets:
        picked = _of_length(sources, low, high)
        if not picked:
            continue
        refs = [[references[i] for i in picked]]
        named: list[tuple[str, Sequence[str]]] = [(name, [systems[name][i] for i in picked]) for name in names]
        if len(named) == 1:  # PairedTest compares systems: a lone one is compared with itself
            named.append(("_", named[0][1]))
        _, scores = PairedTest(named, {"BLEU": BLEU(), "chrF": CHRF()}, refs, test_type="bs",
                               n_samples=n_samples)()
        row: dict = {"bucket": f"{low}-{high}", "low": low, "high": high, "sentences": len(picked), "systems": {}}
        for k, name in enumerate(names):
            cells: dict[str, float | None] = {}
            for metric, key in (("BLEU", "bleu"), ("chrF2", "chrf")):
                result = scores[metric][k]
                assert isinstance(result, Result)  # the "System" column holds the names, these the results
                cells[key] = float(result.score)
                cells[f"{key}_mean"] = float(result.mean or 0.0)
                cells[f"{key}_ci"] = float(result.ci or 0.0)  # 95% interval: mean +- ci
                if k > 0:  # equal scores are no difference at all: sacreBLEU's convention gives them p = 1 / (n + 1)
                    baseline = scores[metric][0]
                    assert isinstance(baseline, Result)
                    same = float(result.score) == float(baseline.score)
                    cells[f"{key}_p"] = None if same else float(result.p_value or 0.0)
            row["systems"][name] = cells
        rows.append(row)
    return rows


def bleu_ratio(sources: Sequence[str], hypotheses: Sequence[str], references: Sequence[str], *,
               long: tuple[int, int] = (41, 80), short: tuple[int, int] = (11, 20),
               n_samples: int = BOOTSTRAP_SAMPLES, seed: int = 12345) -> dict:
    """BLEU on sources of ``long`` words over BLEU on sources of ``short`` words, with a 95%
    percentile bootstrap interval (each group resampled on its own, sentence statistics summed as
    sacreBLEU's bootstrap does). The number behind "Figure 2's shape": near 1 when quality holds
    as sentences get longer, far below when it falls."""
    import numpy as np
    from sacrebleu.metrics import BLEU

    bleu = BLEU()
    groups = []
    for low, high in (long, short):
        picked = _of_length(sources, low, high)
        if not picked:
            raise ValueError(f"no sentence with a source of {low}-{high} words")
        stats = bleu._extract_corpus_statistics([hypotheses[i] for i in picked], [[references[i] for i in picked]])
        groups.append(np.array(stats, dtype=np.float64))
    rng = np.random.default_rng(seed)
    scores = []
    for stats in groups:
        whole = bleu._compute_score_from_stats(stats.sum(0)).score
        samples = rng.choice(len(stats), size=(n_samples, len(stats)), replace=True)
        scores.append((whole, np.array([bleu._compute_score_from_stats(stats[s].sum(0)).score for s in samples])))
    (long_bleu, long_samples), (short_bleu, short_samples) = scores
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = long_samples / short_samples
    ratios = ratios[np.isfinite(ratios)]
    return {"long": f"{long[0]}-{long[1]}", "short": f"{short[0]}-{short[1]}", "long_bleu": long_bleu,
            "short_bleu": short_bleu, "long_sentences": len(groups[0]), "short_sentences": len(groups[1]),
            "ratio": long_bleu / short_bleu if short_bleu else float("nan"),
            "ratio_low": float(np.percentile(ratios, 2.5)) if len(ratios) else float("nan"),
            "ratio_high": float(np.percentile(ratios, 97.5)) if len(ratios) else float("nan"),
            "samples": n_samples}
