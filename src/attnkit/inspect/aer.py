"""Alignment error rate of every way to read alignments: each checkpoint's cross attention read
every way (each decoder layer, each head and the heads' average, shift-att or not, argmax or a
weight threshold) and chosen on dev, integrated-gradient attributions, eflomal, IBM Model 1 and the
diagonal, on the held-out verses of the bundled Greek -> English corpus. The computation behind
:func:`attnkit.inspect.report.evaluate_alignment`, which renders it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._progress import progress_bar
from ..data import aligned_corpus
from .alignment import (
    IBMModel1,
    alignment_error_rate,
    cross_attention_pieces,
    diagonal_alignment,
    eflomal_align,
    links_from_weights,
    select_weights,
    symmetrize,
    word_weights,
)

__all__ = ["score_alignments"]

logger = logging.getLogger(__name__)


def _readings(pieces: np.ndarray) -> list[tuple[int, int | None, bool]]:
    """Every (layer, head or None for the heads' average, shift) reading of a cross-attention stack."""
    layers, heads = pieces.shape[:2]
    choices = (None, *range(heads)) if heads > 1 else (None,)
    return [(layer, head, shift) for layer in range(layers) for head in choices for shift in (False, True)]


def _reading_name(reading: tuple[int, int | None, bool], layers: int) -> str:
    layer, head, shift = reading
    where = f"layer {layer + 1}/{layers}, " if layers > 1 else ""
    return f"{'shift-att' if shift else 'attention'}, {where}{'head average' if head is None else f'head {head}'}"


def _links(weights: np.ndarray, rule: str):
    if rule == "argmax":
        return links_from_weights(weights)
    return links_from_weights(weights, method="threshold", threshold=float(rule.split(">= ")[1]))


def _attention_methods(label: str, checkpoint, test, dev, thresholds, progress) -> dict:
    """Every attention reading of one checkpoint scored on dev; on test: the last layer's head
    average (plain and shift-att) with every rule, the dev-best reading, and per-layer rows."""
    model, source, target = checkpoint.model, checkpoint.source_tokenizer, checkpoint.target_tokenizer
    gold, dev_gold = [p.alignment for p in test], [p.alignment for p in dev]
    test_pieces = cross_attention_pieces(model, source, target, test)
    dev_pieces = cross_attention_pieces(model, source, target, dev)
    layers, heads = test_pieces[0].shape[:2]
    rules = ["argmax", *(f"weight >= {t}" for t in thresholds)]

    def words(pairs, pieces, reading):
        layer, head, shift = reading
        return [word_weights(select_weights(p, layer=layer, head=head, shift=shift), source.word_ids(pair.source),
                             target.word_ids(pair.target)) for pair, p in zip(pairs, pieces)]

    grid = {}  # (reading, rule) -> dev AER
    for reading in progress_bar(_readings(test_pieces[0]), progress=progress, desc=f"{label}: readings on dev", unit="reading"):
        dev_words = words(dev, dev_pieces, reading)
        for rule in rules:
            grid[reading, rule] = alignment_error_rate([_links(w, rule) for w in dev_words], dev_gold).aer
    (best_reading, best_rule), best_dev = min(grid.items(), key=lambda item: item[1])
    methods, dev_aer, test_words = {}, {}, {}
    for reading in dict.fromkeys([(layers - 1, None, False), (layers - 1, None, True), best_reading]):
        test_words[reading] = words(test, test_pieces, reading)
        for rule in rules:
            name = f"{label}: {_reading_name(reading, layers)}, {rule}"
            if (reading, rule) == (best_reading, best_rule):
                name += " (best on dev)"
            methods[name] = [_links(w, rule) for w in test_words[reading]]
            dev_aer[name] = grid[reading, rule]
    per_layer = []
    for layer in range(layers):
        for shift in (False, True):
            reading = (layer, None, shift)
            layer_words = test_words.get(reading) or words(test, test_pieces, reading)
            per_layer.append({"model": label, "layer": layer + 1, "shift": shift, **{
                rule: {"dev": grid[reading, rule],
                       "test": alignment_error_rate([_links(w, rule) for w in layer_words], gold).aer}
                for rule in ("argmax", f"weight >= {thresholds[0]}")}})
    best = {"model": label, "checkpoint": str(checkpoint.folder), "layer": best_reading[0] + 1,
            "head": best_reading[1], "shift": best_reading[2], "rule": best_rule, "dev_aer": best_dev,
            "readings_tried": len(grid), "layers": layers, "heads": heads,
            "method": next(name for name in methods if name.endswith("(best on dev)"))}
    return {"methods": methods, "dev_aer": dev_aer, "per_layer": per_layer, "best": best,
            "example_words": test_words[best_reading]}


def _attribution_methods(label: str, checkpoint, test, dev, thresholds, steps: int, progress) -> dict:
    """Alignments from integrated gradients (instead of attention): the rule chosen on dev."""
    from .alignment import attribution_word_weights

    model, source, target = checkpoint.model, checkpoint.source_tokenizer, checkpoint.target_tokenizer
    rules = ["argmax", *(f"weight >= {t}" for t in thresholds)]
    dev_words = attribution_word_weights(model, source, target, progress_bar(dev, progress=progress, desc=f"{label}: IG on dev"),
                                         steps=steps)
    dev_aer = {rule: alignment_error_rate([_links(w, rule) for w in dev_words], [p.alignment for p in dev]).aer
               for rule in rules}
    best_rule = min(dev_aer, key=lambda rule: dev_aer[rule])
    test_words = attribution_word_weights(model, source, target, progress_bar(test, progress=progress, desc=f"{label}: IG on test"),
                                          steps=steps)
    methods, named_dev = {}, {}
    for rule in dict.fromkeys(["argmax", best_rule]):
        name = f"{label}: integrated gradients ({steps} steps), {rule}" + (" (best on dev)" if rule == best_rule else "")
        methods[name] = [_links(w, rule) for w in test_words]
        named_dev[name] = dev_aer[rule]
    return {"methods": methods, "dev_aer": named_dev}


def score_alignments(checkpoints, *, limit: int | None = None, dev_limit: int | None = None, ibm_iterations: int = 5,
                       thresholds: Sequence[float] = (0.2, 0.3, 0.5), eflomal: bool = True,
                       attribution_steps: int = 0, progress: bool = False,
                       log: Callable[[str], None] | None = None) -> tuple[dict, tuple]:
    """AER on the held-out verses of the bundled Greek -> English corpus, in one table: each
    checkpoint's attention read every way (each decoder layer, each head and the heads' average,
    the row that predicts a word or, shift-att, the row that reads it; argmax or a weight
    threshold), next to eflomal (both directions, intersection, grow-diag-final-and), IBM Model 1
    and the diagonal; with ``attribution_steps`` > 0 also alignments of the first checkpoint from
    integrated gradients (:func:`~attnkit.inspect.alignment.attribution_word_weights`; costly, so
    for one model), their rule chosen on dev.

    ``checkpoints``: one checkpoint, or a dict label -> checkpoint. For each, the reading with the
    lowest AER on the dev verses (the "valid" split; its first ``dev_limit`` verses where given) is
    reported on test; nothing is chosen on test. ``limit`` keeps the first test verses. The statistical
    aligners learn from the text of every verse (train, all of dev, and the test verses scored) without
    gold links, as aligners are used.

    Returns the JSON-ready result (``scores``, ``dev_aer``, ``best_on_dev``, ``per_layer`` ...) and
    an example verse of about 14 words: (pair, the first checkpoint's best attention reading as a
    (target words, source words) matrix, the gold links as one).
    """
    log = log or logger.info
    if not isinstance(checkpoints, dict):
        checkpoints = {"attention": checkpoints}
    if not checkpoints:
        raise ValueError("checkpoints is empty: give at least one checkpoint")
    for name, value in (("limit", limit), ("dev_limit", dev_limit)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive number of verses or None (all), got {value!r}")
    test, all_dev, train = aligned_corpus("test")[:limit], aligned_corpus("valid"), aligned_corpus("train")
    dev = all_dev[:dev_limit]
    if any(p.alignment is None for p in test + dev):
        raise ValueError("the aligned corpus has a verse without gold links")
    gold = [p.alignment or () for p in test]
    seconds: dict[str, float] = {}
    methods: dict[str, list] = {}
    dev_aer: dict[str, float] = {}
    per_layer: list[dict] = []
    best: list[dict] = []
    example_words: list | None = None
    for label, checkpoint in checkpoints.items():
        tick = time.perf_counter()
        found = _attention_methods(label, checkpoint, test, dev, thresholds, progress)
        methods |= found["methods"]
        dev_aer |= found["dev_aer"]
        per_layer += found["per_layer"]
        best.append(found["best"])
        example_words = example_words or found["example_words"]
        seconds[label] = time.perf_counter() - tick
        log(f"{label}: {found['best']['readings_tried']} attention readings in {seconds[label]:.1f} s")
        if attribution_steps and label == next(iter(checkpoints)):
            tick = time.perf_counter()
            attributed = _attribution_methods(label, checkpoint, test, dev, thresholds, attribution_steps, progress)
            methods |= attributed["methods"]
            dev_aer |= attributed["dev_aer"]
            seconds[f"{label}: integrated gradients"] = time.perf_counter() - tick
            log(f"{label}: integrated-gradient alignments in {seconds[f'{label}: integrated gradients']:.1f} s")
    log(f"IBM Model 1 ({ibm_iterations} EM iterations) ...")
    words_of = lambda p: (p.source.lower().split(), p.target.lower().split())  # noqa: E731
    corpus = [words_of(p) for p in train + all_dev + test]
    ibm = IBMModel1().fit(corpus, iterations=ibm_iterations, progress=progress)
    methods["IBM Model 1"] = [ibm.align(*words_of(p)) for p in test]
    if eflomal:
        tick = time.perf_counter()
        log(f"eflomal on {len(corpus):,} verses ...")
        forward, reverse = eflomal_align(corpus)
        tail = slice(len(corpus) - len(test), len(corpus))
        forward, reverse = forward[tail], reverse[tail]
        methods["eflomal, Greek -> English"] = forward
        methods["eflomal, English -> Greek"] = reverse
        for how in ("intersection", "grow-diag-final-and"):
            methods[f"eflomal, {how}"] = [symmetrize(f, r, how) for f, r in zip(forward, reverse)]
        seconds["eflomal"] = time.perf_counter() - tick
    methods["diagonal"] = [diagonal_alignment(len(p.source.split()), len(p.target.split())) for p in test]
    scores = {name: alignment_error_rate(links, gold)._asdict() for name, links in methods.items()}
    example = max(range(len(test)), key=lambda k: -abs(len(test[k].source.split()) - 14))  # a verse of ~14 words
    pair = test[example]
    assert example_words is not None  # set by the first checkpoint
    gold_matrix = np.zeros_like(example_words[example])
    for i, j in pair.alignment or ():
        gold_matrix[j, i] = 1.0
    result: dict[str, Any] = {"verses": len(test), "dev_verses": len(dev), "dev_verses_total": len(all_dev), "gold_links": sum(len(g) for g in gold), "scores": scores,
              "dev_aer": dev_aer, "best_on_dev": best, "per_layer": per_layer,
              "ibm_iterations": ibm_iterations, "ibm_log_likelihoods": ibm.log_likelihoods,
              "checkpoints": {label: str(c.folder) for label, c in checkpoints.items()}, "example": pair.reference,
              "seconds": seconds, "corpus_verses": len(corpus)}
    return result, (pair, example_words[example], gold_matrix)
