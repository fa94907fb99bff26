"""Gradient attribution of a model's scalar output to its input tokens, and how well attention
agrees with it (the "attention is not explanation" question, Jain & Wallace 2019).

- integrated gradients (Sundararajan et al. 2017): with input embeddings x, a baseline x' and
  F the scalar output, token t's attribution is
  sum_d (x - x')_td * mean_k dF/dx_td(x' + a_k (x - x')) over m midpoint steps a_k = (k + 0.5) / m;
  the attributions add up to F(x) - F(x') (completeness) as m grows;
- gradient x input: sum_d x_td * dF/dx_td at the input.

The embeddings are reached through a forward hook on the model's token-embedding module, so
any model whose forward looks tokens up in an ``nn.Embedding`` works without changes. Agreement
between two per-token scores is measured with Spearman's rho and Kendall's tau-b.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["integrated_gradients", "gradient_x_input", "spearman", "kendall", "rank"]


def _attribute(forward: Callable[[], Tensor], embedding: nn.Module, scale: Tensor, baseline: Tensor | None) -> tuple[Tensor, Tensor]:
    """Run ``forward`` with the embedding output replaced by baseline + scale * (x - baseline);
    return (x - baseline, gradient of the summed output per scaled copy)."""
    captured = {}

    def hook(module, args, output):
        if output.shape[0] != scale.shape[0]:
            raise ValueError(f"the model's batch must be the {scale.shape[0]} interpolation steps, got {output.shape[0]}")
        base = torch.zeros_like(output) if baseline is None else baseline.expand_as(output).to(output.dtype)
        delta = (output - base).detach()
        inputs = (base + scale.to(output.dtype).view(-1, *[1] * (output.ndim - 1)) * delta).requires_grad_(True)
        captured["inputs"], captured["delta"] = inputs, delta
        return inputs

    handle = embedding.register_forward_hook(hook)
    try:
        with torch.enable_grad():
            values = forward()
            if values.shape != (scale.shape[0],):
                raise ValueError(f"forward must return one scalar per step, shape ({scale.shape[0]},), got {tuple(values.shape)}")
            (grad,) = torch.autograd.grad(values.sum(), captured["inputs"])
    finally:
        handle.remove()
    return captured["delta"][0], grad


def integrated_gradients(forward: Callable[[int], Tensor], embedding: nn.Module, *, steps: int = 32,
                         baseline: Tensor | None = None) -> Tensor:
    """Per-token integrated gradients, (L,).

    ``forward(m)`` runs the model on a batch of m copies of the one input and returns the (m,)
    scalar outputs; ``embedding`` is the ``nn.Embedding`` whose (m, L, D) output is interpolated
    from ``baseline`` ((L, D) or broadcastable; zeros by default) to the real embeddings.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    alphas = (torch.arange(steps, dtype=torch.float64) + 0.5) / steps
    delta, grad = _attribute(lambda: forward(steps), embedding, alphas, baseline)
    return (delta.double() * grad.double().mean(0)).sum(-1)


def gradient_x_input(forward: Callable[[int], Tensor], embedding: nn.Module) -> Tensor:
    """Per-token gradient x input, (L,): sum over the embedding dimension of x * dF/dx."""
    delta, grad = _attribute(lambda: forward(1), embedding, torch.ones(1, dtype=torch.float64), None)
    return (delta.double() * grad[0].double()).sum(-1)


def rank(values) -> np.ndarray:
    """Ranks from 1, ties sharing their mean rank."""
    x = np.asarray(values, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    sorted_x = x[order]
    start = 0
    for end in range(1, len(x) + 1):
        if end == len(x) or sorted_x[end] != sorted_x[start]:
            ranks[order[start:end]] = (start + end + 1) / 2
            start = end
    return ranks


def _pair(a, b) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape or len(a) < 2:
        raise ValueError(f"need two 1-D score vectors of the same length >= 2, got shapes {a.shape} and {b.shape}")
    return a, b


def spearman(a, b) -> float:
    """Spearman's rank correlation (Pearson on the ranks, ties at mean rank); NaN if either is constant."""
    a, b = _pair(a, b)
    ra, rb = rank(a) - (len(a) + 1) / 2, rank(b) - (len(b) + 1) / 2
    denominator = np.sqrt((ra**2).sum() * (rb**2).sum())
    return float((ra * rb).sum() / denominator) if denominator > 0 else float("nan")


def kendall(a, b) -> float:
    """Kendall's tau-b (ties corrected), O(L^2); NaN if either is constant."""
    a, b = _pair(a, b)
    da = np.sign(a[:, None] - a[None, :])
    db = np.sign(b[:, None] - b[None, :])
    upper = np.triu_indices(len(a), 1)
    da, db = da[upper], db[upper]
    denominator = np.sqrt((da != 0).sum() * (db != 0).sum())
    return float((da * db).sum() / denominator) if denominator > 0 else float("nan")
