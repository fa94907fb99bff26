"""Gradient and perturbation attribution of a model's scalar output to its input tokens, and how
well attention agrees with it (the "attention is not explanation" question, Jain & Wallace 2019).

The attributions come from Captum (the PyTorch attribution library), on the input embeddings:

- integrated gradients (Sundararajan et al. 2017): with input embeddings x, a baseline x' and
  F the scalar output, token t's attribution is
  sum_d (x - x')_td * mean_k dF/dx_td(x' + a_k (x - x')) over m midpoint steps a_k = (k + 0.5) / m
  (Captum's ``riemann_middle``); the attributions add up to F(x) - F(x') as m grows;
- gradient x input: sum_d x_td * dF/dx_td at the input;
- Shapley values by sampling (Castro et al. 2009; Captum's ``ShapleyValueSampling``): each token's
  average marginal contribution over random orders in which the tokens are switched from the
  baseline (zero embedding) to their real embedding; the values add up to F(x) - F(x') exactly
  in every sample.

The embeddings are reached through a forward hook on the model's token-embedding module, so any
model whose forward looks tokens up in an ``nn.Embedding`` works without changes. Rank statistics
(Spearman's rho, Kendall's tau-b) are SciPy's.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["integrated_gradients", "gradient_x_input", "shapley_values", "spearman", "kendall", "rank"]


def _captum():
    try:
        from captum import attr
    except ImportError as error:
        raise ImportError("attribution needs Captum: pip install 'attnkit[inspect]' (or captum)") from error
    return attr


def _on_embeddings(forward: Callable[[int], Tensor], embedding: nn.Module,
                   outputs: int | None = None) -> tuple[Callable[[Tensor], Tensor], Tensor]:
    """(f, x): ``f(e)`` runs ``forward(m)`` with ``embedding``'s (m, L, D) output replaced by ``e``
    and checks it returns (m,) scalars; ``x`` is the real (1, L, D) embedding output.

    With ``outputs`` = n, ``forward(m)`` returns (m, n): n scalars per copy, and ``f`` keeps output
    ``k mod n`` of copy k, so that a batch whose row k attributes output k mod n (Captum expands
    inputs step-major) gets every output's attribution from one backward pass."""
    captured = {}

    def keep(module, args, output):
        captured["x"] = output.detach()

    handle = embedding.register_forward_hook(keep)
    try:
        with torch.no_grad():
            forward(1)
    finally:
        handle.remove()
    if "x" not in captured:
        raise ValueError("forward never called the embedding module: pass the nn.Embedding the model looks tokens up in")
    x = captured["x"]

    def f(e: Tensor) -> Tensor:
        m = e.shape[0]

        def replace(module, args, output):
            if output.shape[0] != m:
                raise ValueError(f"the model's batch must be the {m} copies asked for, got {output.shape[0]}")
            return e.to(output.dtype)

        handle = embedding.register_forward_hook(replace)
        try:
            values = forward(m)
        finally:
            handle.remove()
        if outputs is None:
            if values.shape != (m,):
                raise ValueError(f"forward must return one scalar per step, shape ({m},), got {tuple(values.shape)}")
            return values
        if values.shape != (m, outputs):
            raise ValueError(f"forward must return {outputs} scalars per copy, shape ({m}, {outputs}), "
                             f"got {tuple(values.shape)}")
        rows = torch.arange(m, device=values.device)
        return values[rows, rows % outputs]

    return f, x


def integrated_gradients(forward: Callable[[int], Tensor], embedding: nn.Module, *, steps: int = 32,
                         baseline: Tensor | None = None, outputs: int | None = None) -> Tensor:
    """Per-token integrated gradients, (L,) float64 on the CPU, by Captum's ``IntegratedGradients``.

    ``forward(m)`` runs the model on a batch of m copies of the one input and returns the (m,)
    scalar outputs; ``embedding`` is the ``nn.Embedding`` whose (m, L, D) output is interpolated
    from ``baseline`` ((L, D) or broadcastable; zeros by default) to the real embeddings.

    ``outputs`` = n: ``forward(m)`` returns (m, n), n scalar outputs of each copy (say the log
    probability of each target word), and the result is (n, L), each output's attribution, from
    one batch of n x ``steps`` copies and one backward pass instead of n separate calls.
    """
    if steps < 2:
        raise ValueError(f"steps must be >= 2 (Captum's midpoint rule), got {steps}")
    if outputs is not None and outputs < 1:
        raise ValueError(f"outputs must be >= 1 or None, got {outputs}")
    f, x = _on_embeddings(forward, embedding, outputs)
    n = 1 if outputs is None else outputs
    x = x.expand(n, *x.shape[1:]).contiguous()
    base = torch.zeros_like(x) if baseline is None else baseline.expand_as(x).to(x.dtype)
    ig = _captum().IntegratedGradients(f)
    with torch.enable_grad():
        attribution = ig.attribute(x, baselines=base, n_steps=steps, method="riemann_middle",
                                   internal_batch_size=steps * n)
    attribution = attribution.detach().cpu().double().sum(-1)  # (n, L)
    return attribution[0] if outputs is None else attribution


def gradient_x_input(forward: Callable[[int], Tensor], embedding: nn.Module) -> Tensor:
    """Per-token gradient x input, (L,) float64 on the CPU: sum over the embedding dimension of x * dF/dx
    (Captum's ``InputXGradient``)."""
    f, x = _on_embeddings(forward, embedding)
    with torch.enable_grad():
        attribution = _captum().InputXGradient(f).attribute(x.clone().requires_grad_(True))
    return attribution[0].detach().cpu().double().sum(-1)


def shapley_values(forward: Callable[[int], Tensor], embedding: nn.Module, *, samples: int = 25,
                   seed: int = 0) -> Tensor:
    """Per-token Shapley values, (L,) float64 on the CPU, estimated from ``samples`` random token orders
    (Captum's ``ShapleyValueSampling``; a token is "absent" when its embedding is zero). Costs
    samples x L forward passes, batched L at a time; reproducible for a given ``seed``."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    f, x = _on_embeddings(forward, embedding)
    L = x.shape[1]
    features = torch.arange(L, device=x.device).view(1, L, 1).expand_as(x).contiguous()
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(seed)
        attribution = _captum().ShapleyValueSampling(f).attribute(
            x, baselines=0.0, feature_mask=features, n_samples=samples, perturbations_per_eval=L)
    return attribution[0, :, 0].detach().cpu().double()


def rank(values) -> np.ndarray:
    """Ranks from 1, ties sharing their mean rank (``scipy.stats.rankdata``)."""
    from scipy.stats import rankdata

    return rankdata(np.asarray(values, dtype=np.float64))


def _pair(a, b) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape or len(a) < 2:
        raise ValueError(f"need two 1-D score vectors of the same length >= 2, got shapes {a.shape} and {b.shape}")
    return a, b


def _statistic(test, a, b) -> float:
    a, b = _pair(a, b)
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")  # a constant ranking has no order to agree with
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(test(a, b).statistic)


def spearman(a, b) -> float:
    """Spearman's rank correlation (``scipy.stats.spearmanr``); NaN if either is constant."""
    from scipy.stats import spearmanr

    return _statistic(spearmanr, a, b)


def kendall(a, b) -> float:
    """Kendall's tau-b, ties corrected (``scipy.stats.kendalltau``); NaN if either is constant."""
    from scipy.stats import kendalltau

    return _statistic(kendalltau, a, b)
