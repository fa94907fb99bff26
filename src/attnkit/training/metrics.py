"""Translation metrics with sacreBLEU: corpus BLEU, chrF, and BLEU by source length."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Scores", "corpus_scores", "bleu_by_length", "LENGTH_BUCKETS"]

# Source length in words: (low, high) inclusive.
LENGTH_BUCKETS = ((1, 10), (11, 15), (16, 20), (21, 25))


@dataclass(frozen=True)
class Scores:
    bleu: float
    chrf: float
    sentences: int
    signature: str  # sacreBLEU's BLEU signature, for reproducibility


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
        picked = [i for i, s in enumerate(sources) if low <= len(s.split()) <= high]
        if picked:
            scores = corpus_scores([hypotheses[i] for i in picked], [references[i] for i in picked])
            rows.append({"bucket": f"{low}-{high}", "low": low, "high": high, "sentences": len(picked),
                         "bleu": scores.bleu, "chrf": scores.chrf})
    return rows
