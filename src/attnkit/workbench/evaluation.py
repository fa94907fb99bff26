"""The workbench's data selection and evaluation: splits of the bundled corpora and users' files,
BLEU and chrF of a model, quality against sentence length, alignment pictures."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..data import Pair, Tokenizer, aligned_corpus, bible_corpus, read_pairs
from ..decoding import Translation, translate
from ..training import bleu_by_length, corpus_scores
from ..training.metrics import bleu_ratio, quality_by_length

__all__ = ["load_split", "evaluate_model", "quality_against_length", "plot_alignment"]


def load_split(data: str, split: str, *, direction: str = "en-fr", valid_fraction: float = 0.05) -> list[Pair]:
    """Pairs of ``split`` from ``data``: "bible" (the bundled KJV / Louis Segond), "grc-en" (the
    bundled word-aligned Greek -> English New Testament) or a ``source<TAB>target`` file.

    A user file has no splits of its own: "valid" is every 20th pair (``valid_fraction``), "train"
    the rest, "test" all of it; pass a separate file for a real test set.
    """
    if data == "bible":
        return bible_corpus(split, direction=direction)
    if data == "grc-en":
        return aligned_corpus(split)
    pairs = read_pairs(data)
    if split == "test":
        return pairs
    every = max(2, round(1 / valid_fraction))
    held = [p for i, p in enumerate(pairs) if i % every == every - 1]
    if split == "valid":
        return held
    return [p for i, p in enumerate(pairs) if i % every != every - 1]


def evaluate_model(
    model, source_tokenizer: Tokenizer, target_tokenizer: Tokenizer, pairs: Sequence[Pair], *, beam_size: int = 5,
    progress: bool = False,
) -> tuple[dict, list[Translation]]:
    """BLEU, chrF and BLEU by source length of ``model`` on ``pairs``; also the translations."""
    started = time.perf_counter()
    outputs = translate(model, [p.source for p in pairs], source_tokenizer, target_tokenizer, beam_size=beam_size,
                        progress=progress)
    hypotheses = [o.text for o in outputs]
    references = [p.target for p in pairs]
    scores = corpus_scores(hypotheses, references)
    return {
        "bleu": scores.bleu,
        "chrf": scores.chrf,
        "sentences": scores.sentences,
        "signature": scores.signature,
        "beam_size": beam_size,
        "seconds": time.perf_counter() - started,
        "by_length": bleu_by_length([p.source for p in pairs], hypotheses, references),
    }, outputs


def quality_against_length(pairs: Sequence[Pair], hypotheses: dict[str, list[str]]) -> dict:
    """BLEU and chrF of each system per source-length bucket with paired bootstrap intervals
    (:func:`~attnkit.training.metrics.quality_by_length`), and each system's BLEU ratio of 41-80
    to 11-20-word sources (:func:`~attnkit.training.metrics.bleu_ratio`; an ``error`` entry where a
    limited set has no source of either length)."""
    sources, references = [p.source for p in pairs], [p.target for p in pairs]
    length: dict[str, Any] = {"buckets": quality_by_length(sources, hypotheses, references), "ratios": {}}
    for name, hyps in hypotheses.items():
        try:
            length["ratios"][name] = bleu_ratio(sources, hyps, references)
        except ValueError as error:
            length["ratios"][name] = {"error": str(error)}
    return length


def plot_alignment(translation: Translation, path: str | Path | None = None, title: str = ""):
    """The alignment of one translation as a heatmap: source pieces across, output pieces down (written to
    ``path`` if given; returned as a :class:`~attnkit.viz.Picture`, shown inline in a notebook)."""
    from ..viz import plot_heatmap

    if translation.weights is None:
        raise ValueError("this translation has no alignment (a model without attention)")
    return plot_heatmap(translation.weights, path, x_labels=translation.source_tokens, y_labels=translation.target_tokens,
                 title=title, x_title="source", y_title="output", cmap="Greys")
