"""Alignment score functions: the "score" step of every mechanism.

One signature, ``score(q, k, **params) -> (..., L, S)``, with q (..., L, Dq) and k (..., S, Dk).
Parameters (projection matrices) are passed in as tensors: the layers own them.

- :func:`dot`: q . k (Luong et al. 2015, "dot").
- :func:`scaled_dot`: q . k / sqrt(E) (Vaswani et al. 2017).
- :func:`general`: q^T W k (Luong et al. 2015, "general").
- :func:`additive`: v^T tanh(W q + U k) (Bahdanau et al. 2014).
- :func:`concat`: v^T tanh(W [q; k]) (Luong et al. 2015, "concat").
"""

from __future__ import annotations

import math

from torch import Tensor

__all__ = ["dot", "scaled_dot", "general", "additive", "concat", "SCORES"]


def _check_pair(q: Tensor, k: Tensor, same_dim: bool) -> None:
    if q.dim() < 2 or k.dim() < 2:
        raise ValueError(
            f"q and k must have shape (..., L, Dq) and (..., S, Dk), got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    if same_dim and q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same last dim for this score, got Dq={q.shape[-1]} and Dk={k.shape[-1]}"
        )


def _check_weight(name: str, w: Tensor, shape: tuple[int, ...]) -> None:
    if tuple(w.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(w.shape)}")


def dot(q: Tensor, k: Tensor) -> Tensor:
    """score(i, j) = q_i . k_j."""
    _check_pair(q, k, same_dim=True)
    return q @ k.transpose(-1, -2)


def scaled_dot(q: Tensor, k: Tensor, *, scale: float | None = None) -> Tensor:
    """score(i, j) = q_i . k_j * scale, scale = 1/sqrt(E) by default."""
    _check_pair(q, k, same_dim=True)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return (q @ k.transpose(-1, -2)) * scale


def general(q: Tensor, k: Tensor, *, weight: Tensor) -> Tensor:
    """score(i, j) = q_i^T W k_j with W of shape (Dq, Dk)."""
    _check_pair(q, k, same_dim=False)
    _check_weight("weight", weight, (q.shape[-1], k.shape[-1]))
    return q @ (k @ weight.transpose(0, 1)).transpose(-1, -2)


def additive(
    q: Tensor, k: Tensor, *, v: Tensor, w_q: Tensor | None = None, w_k: Tensor | None = None
) -> Tensor:
    """score(i, j) = v^T tanh(W_q q_i + W_k k_j) (Bahdanau et al. 2014, eq. 6: e = v^T tanh(W s + U h)).

    Args:
        q: (..., L, Dq) queries, or already projected queries (..., L, A) if ``w_q`` is None.
        k: (..., S, Dk) keys, or already projected keys (..., S, A) if ``w_k`` is None; projecting
            the keys once per source sentence and passing them here avoids redoing it every step.
        v: (A,) scoring vector.
        w_q: (A, Dq) or None. w_k: (A, Dk) or None.
    """
    _check_pair(q, k, same_dim=False)
    if w_q is not None:
        _check_weight("w_q", w_q, (w_q.shape[0], q.shape[-1]))
        q = q @ w_q.transpose(0, 1)
    if w_k is not None:
        _check_weight("w_k", w_k, (w_k.shape[0], k.shape[-1]))
        k = k @ w_k.transpose(0, 1)
    if q.shape[-1] != k.shape[-1] or v.shape != (q.shape[-1],):
        raise ValueError(
            f"projected q, projected k and v must share the attention dim A, got "
            f"{q.shape[-1]}, {k.shape[-1]} and v of shape {tuple(v.shape)}"
        )
    hidden = (q.unsqueeze(-2) + k.unsqueeze(-3)).tanh()  # (..., L, S, A)
    return hidden @ v


def concat(q: Tensor, k: Tensor, *, weight: Tensor, v: Tensor) -> Tensor:
    """score(i, j) = v^T tanh(W [q_i; k_j]) with W of shape (A, Dq + Dk) (Luong et al. 2015).

    Equal to :func:`additive` with W split column-wise into [W_q | W_k], which is how it is computed
    (never materialising the (L, S, Dq + Dk) concatenation).
    """
    _check_pair(q, k, same_dim=False)
    _check_weight("weight", weight, (weight.shape[0], q.shape[-1] + k.shape[-1]))
    w_q, w_k = weight.split([q.shape[-1], k.shape[-1]], dim=1)
    return additive(q, k, v=v, w_q=w_q, w_k=w_k)


SCORES = {"dot": dot, "scaled_dot": scaled_dot, "general": general, "additive": additive, "concat": concat}
