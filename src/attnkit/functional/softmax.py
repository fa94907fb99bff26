"""Masked softmax: the "normalise" step shared by every mechanism.

A fully masked row gives all-zero weights (never NaN), and masked positions get exactly zero.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["masked_softmax", "masked_logsumexp"]


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")


def _check_mask(scores: Tensor, mask: Tensor | None) -> None:
    if mask is None:
        return
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
    try:
        shape = torch.broadcast_shapes(mask.shape, scores.shape)
    except RuntimeError:
        shape = None
    if shape != scores.shape:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to scores of shape {tuple(scores.shape)}"
        )


def masked_softmax(
    scores: Tensor, mask: Tensor | None = None, *, dim: int = -1, temperature: float = 1.0
) -> Tensor:
    """softmax(scores / temperature) over ``dim``, restricted to positions where ``mask`` is True.

    Args:
        scores: (..., L, S) alignment scores.
        mask: boolean, broadcastable to ``scores``; True = may attend. None attends everywhere.
        temperature: > 0; as it goes to 0 the weights become one-hot on the arg-max
            (hard alignment), large values flatten them.

    Returns:
        Weights of the shape of ``scores``: rows sum to 1 over allowed positions, masked
        positions are exactly 0, fully masked rows are all 0. A score of -inf (what an additive
        float mask gives) counts as masked, so a row of -inf scores also gives zeros, not NaN.
        A NaN score is not masked: it makes its row NaN.
    """
    _check_temperature(temperature)
    _check_mask(scores, mask)
    return _masked_softmax(scores, mask, dim=dim, temperature=temperature)


def _masked_softmax(scores: Tensor, mask: Tensor | None, *, dim: int = -1, temperature: float = 1.0) -> Tensor:
    """:func:`masked_softmax` without the checks, for callers that validated their inputs."""
    if temperature != 1.0:
        scores = scores / temperature
    finite_below = scores != float("-inf")  # NaN != -inf: NaN stays in and propagates
    if mask is None:  # -inf, the only score below the lowest finite one, raised to it (clamp keeps NaN): one op fewer
        filled = scores.clamp_min(torch.finfo(scores.dtype).min)
        mask = finite_below
    else:
        mask = mask & finite_below
        filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    # A fully masked row is uniform after softmax; zeroing the masked entries makes it all 0. Zeroed by
    # a product, not a fill, so that a row a NaN made NaN stays NaN at its masked keys too.
    return torch.softmax(filled, dim=dim) * mask


def masked_logsumexp(scores: Tensor, mask: Tensor | None = None, *, dim: int = -1) -> Tensor:
    """log(sum(exp(scores))) over allowed positions; -inf for a fully masked row."""
    _check_mask(scores, mask)
    return _masked_logsumexp(scores, mask, dim=dim)


def _masked_logsumexp(scores: Tensor, mask: Tensor | None, *, dim: int = -1) -> Tensor:
    """:func:`masked_logsumexp` without the checks. A fully masked row gives -inf and a zero
    gradient (torch's logsumexp over a row of -inf has a NaN gradient): its masked scores are
    filled with a finite value and the result set to -inf afterwards.

    Written as m + log(sum(exp(s - m))) with the row maximum m held constant, so that its gradient is
    the softmax exp(s - m) / sum(...) itself. torch.logsumexp's backward takes exp(s - lse) instead,
    which is 1 for every key of a row whose scores are all huge (a bias of -1e9: m + log S rounds to m
    in float32), S times the softmax."""
    allowed = scores != float("-inf")  # NaN != -inf: NaN stays in and propagates
    allowed = allowed if mask is None else mask & allowed
    filled = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    if filled.shape[dim] == 0:  # no key at all: every row is empty
        return filled.sum(dim=dim).fill_(float("-inf"))
    row_max = filled.amax(dim=dim, keepdim=True).detach()
    lse = (filled - row_max).exp().sum(dim=dim).log() + row_max.squeeze(dim)
    return lse.masked_fill(~allowed.any(dim=dim), float("-inf"))
