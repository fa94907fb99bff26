"""Do attention heads resolve pronouns? Winograd-style pairs (Levesque et al. 2012): the same
sentence with one word changed flips what the pronoun refers to ("The trophy didn't fit in the
suitcase because it was too big / small"). A head "picks" the antecedent when the pronoun's
attention puts more mass on the antecedent's word pieces than on the other candidate's (a tie
counts as wrong).

Per head: the share of sentences where it picks correctly, against chance (50%) with an exact
binomial test and a Clopper-Pearson 95% interval (SciPy). Choosing the best of many heads on the
same sentences overstates it, so the best head is also chosen on one half of the pairs and scored
on the other half (both variants of a pair stay in the same half), and the other way round.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from ..data.corpus import CorefItem

__all__ = ["coreference_picks", "coreference_scores", "HeadScore"]


class HeadScore(NamedTuple):
    layer: int
    head: int
    correct: int
    total: int
    accuracy: float
    low: float  # 95% Clopper-Pearson interval
    high: float
    p_value: float  # exact two-sided binomial test against 0.5


def _pieces_of(word: str, sentence: str, offsets: Sequence[tuple[int, int]]) -> list[int]:
    """Token indices whose character span (less surrounding spaces) lies inside the one whole-word
    occurrence of ``word``."""
    spans = [m.span() for m in re.finditer(rf"\b{re.escape(word)}\b", sentence, flags=re.IGNORECASE)]
    if len(spans) != 1:
        raise ValueError(f"{word!r} must occur exactly once as a word in {sentence!r}, found {len(spans)}")
    start, end = spans[0]
    pieces = []
    for k, (a, b) in enumerate(offsets):
        while a < b and sentence[a].isspace():  # byte-level BPE pieces carry the space before a word
            a += 1
        while b > a and sentence[b - 1].isspace():
            b -= 1
        if b > a and a >= start and b <= end:
            pieces.append(k)
    if not pieces:
        raise ValueError(f"no token of {sentence!r} covers {word!r}")
    return pieces


@torch.no_grad()
def coreference_picks(model, tokenizer, items: Sequence[CorefItem]) -> np.ndarray:
    """(items, layers, heads) margins: the pronoun's attention mass on the antecedent's pieces minus
    that on the other candidate's (averaged over the pronoun's pieces). Positive = a correct pick.
    ``model`` is an attnkit :class:`~attnkit.models.EncoderModel`, ``tokenizer`` a ``tokenizers`` one."""
    model.eval()
    device = next(model.parameters()).device
    margins = []
    for item in items:
        encoding = tokenizer.encode(item.sentence)
        ids = torch.tensor([encoding.ids], device=device)
        out = model(ids, torch.ones_like(ids), torch.tensor([encoding.type_ids], device=device), need_weights=True)
        weights = torch.stack([a[0] for a in out.attentions]).cpu().double()  # (layers, H, L, L)
        offsets = encoding.offsets
        pronoun = _pieces_of(item.pronoun, item.sentence, offsets)
        rows = weights[:, :, pronoun].mean(2)  # (layers, H, L)
        right = rows[..., _pieces_of(item.antecedent, item.sentence, offsets)].sum(-1)
        wrong = rows[..., _pieces_of(item.other, item.sentence, offsets)].sum(-1)
        margins.append((right - wrong).numpy())
    return np.stack(margins)


def _score(correct: np.ndarray, layer: int, head: int) -> HeadScore:
    from scipy.stats import binomtest

    k, n = int(correct.sum()), int(correct.size)
    test = binomtest(k, n, 0.5)
    interval = test.proportion_ci(0.95)
    return HeadScore(layer, head, k, n, k / n, float(interval.low), float(interval.high), float(test.pvalue))


def coreference_scores(margins: np.ndarray, items: Sequence[CorefItem]) -> dict:
    """Per-head accuracy with its interval and test; the best head chosen on each half of the pairs
    and scored on the other. ``margins`` from :func:`coreference_picks`."""
    if margins.ndim != 3 or margins.shape[0] != len(items):
        raise ValueError(f"margins must be (items={len(items)}, layers, heads), got shape {margins.shape}")
    correct = margins > 0
    layers, heads = correct.shape[1:]
    per_head = [_score(correct[:, layer, head], layer, head) for layer in range(layers) for head in range(heads)]
    pairs = np.array([item.pair for item in items])
    halves = [pairs % 2 == 1, pairs % 2 == 0]
    held_out = []
    for choose, score in (halves, halves[::-1]):
        accuracy = correct[choose].mean(0)  # (layers, heads)
        layer, head = np.unravel_index(int(accuracy.argmax()), accuracy.shape)
        chosen = _score(correct[score, layer, head], int(layer), int(head))
        held_out.append({"chosen_on": "odd pairs" if choose is halves[0] else "even pairs",
                         "chosen_accuracy": float(accuracy[layer, head]), **chosen._asdict()})
    best = max(per_head, key=lambda s: s.accuracy)
    return {"items": len(items), "pairs": len(set(pairs.tolist())), "per_head": [s._asdict() for s in per_head],
            "best_in_sample": best._asdict(), "held_out": held_out,
            "mean_head_accuracy": float(correct.mean())}
