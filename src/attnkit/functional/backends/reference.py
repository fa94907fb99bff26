"""The "reference" backend: the three steps written out, score -> masked softmax -> weighted sum.

Materialises the (B, H, L, S) weights, so it always returns them. Half-precision inputs are
computed in float32 and the output cast back. Grouped-query heads are broadcast with a view,
never copied.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from ..softmax import _masked_logsumexp, _masked_softmax
from ._common import BackendResult, Problem, compute_dtype, group_heads

__all__ = ["forward"]


def forward(q: Tensor, k: Tensor, v: Tensor, problem: Problem, lse: bool = True) -> BackendResult:
    """The backend's call. ``lse=False`` leaves the log-sum-exp out (``auto``'s small score_mod calls, which
    return none unless asked: a quarter of such a call's ops, benchmarks/overhead.py)."""
    dims = problem.dims
    acc = compute_dtype(q.dtype)
    q_g = group_heads(q, dims).to(acc)  # (B, Hkv, G, L, E)
    k_g = k[:, :, None].to(acc)  # (B, Hkv, 1, S, E)
    v_g = v[:, :, None].to(acc)  # (B, Hkv, 1, S, Ev)
    scores = (q_g @ k_g.transpose(-1, -2)) * problem.scale  # (B, Hkv, G, L, S)
    if problem.bias is not None:
        scores = scores + group_heads(problem.bias, dims).to(acc)
    if problem.score_mod is not None:
        scores = problem.modify_scores(scores.flatten(1, 2), 0, 0).unflatten(1, (dims.Hkv, dims.groups))
    mask = group_heads(problem.dense_mask(q.device), dims)
    weights = _masked_softmax(scores, mask)  # the mask was validated by attention()
    attended = F.dropout(weights, p=problem.dropout_p) if problem.dropout_p > 0 else weights
    output = attended @ v_g  # (B, Hkv, G, L, Ev)
    return BackendResult(
        output=output.flatten(1, 2).to(q.dtype),
        lse=_masked_logsumexp(scores, mask).flatten(1, 2) if lse else None,  # (B, H, L)
        weights=weights.flatten(1, 2).to(q.dtype),
    )
