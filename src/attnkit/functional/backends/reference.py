"""The "reference" backend: the three steps written out, score -> masked softmax -> weighted sum.

Materialises the (B, H, L, S) weights, so it always returns them. Half-precision inputs are
computed in float32 and the output cast back. Grouped-query heads are broadcast with a view,
never copied, except under torch.export, where the keys and values are repeated per query head.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from ..heads import repeat_kv
from ..precision import compute_dtype
from ..softmax import _masked_logsumexp, _masked_softmax
from ..tracing import exporting
from .common import BackendResult, Problem, group_heads

__all__ = ["forward"]


def forward(q: Tensor, k: Tensor, v: Tensor, problem: Problem, lse: bool = True) -> BackendResult:
    """The backend's call. ``lse=False`` leaves the log-sum-exp out (``auto``'s small score_mod calls, which
    return none unless asked: a quarter of such a call's ops, benchmarks/overhead.py). With as many key as query
    heads the scores are (B, H, L, S) as they come; grouped heads are lined up as (B, Hkv, G, L, S), by views."""
    dims = problem.dims
    acc = compute_dtype(q.dtype)
    cast = acc is not q.dtype  # (Tensor.to costs a microsecond even where it returns its input)
    grouped = dims.H != dims.Hkv  # (seven views a call fewer where not: a small score_mod call's microseconds)
    if grouped and exporting():  # keys and values repeated per query head, as transformers' eager attention does:
        # a view of a broadcast product carries the lengths into guards that torch 2.11's export refuses under
        # dynamic lengths, and the scores outweigh the copy
        k, v = repeat_kv(k, dims.groups), repeat_kv(v, dims.groups)
        grouped = False
    q_g, k_g, v_g = (group_heads(q, dims), k.unsqueeze(2), v.unsqueeze(2)) if grouped else (q, k, v)
    if cast:
        q_g, k_g, v_g = q_g.to(acc), k_g.to(acc), v_g.to(acc)
    scores = (q_g @ k_g.transpose(-1, -2)) * problem.scale  # (B, Hkv, G, L, S), or (B, H, L, S)
    if problem.bias is not None:
        bias = group_heads(problem.bias, dims) if grouped else problem.bias
        scores = scores + (bias.to(acc) if bias.dtype is not acc else bias)
    mask = problem.dense_mask(q.device)
    if grouped:
        mask = group_heads(mask, dims)
    if problem.score_mod is not None:
        if mask is not None:  # a masked key's score enters the score_mod as 0: what it made of a NaN there (a bias's)
            scores = scores.masked_fill(~mask, 0.0)  # would reach the gradients as 0 x NaN. (~mask: a tensor of this
            # call's; the mask itself may be kept from a call under inference_mode, which autograd may not save)
        scores = (problem.modify_scores(scores.flatten(1, 2), 0, 0).view(scores.shape) if grouped
                  else problem.modify_scores(scores, 0, 0))
    weights = _masked_softmax(scores, mask)  # the mask was validated by attention()
    attended = F.dropout(weights, p=problem.dropout_p) if problem.dropout_p > 0 else weights
    output = attended @ v_g  # (B, Hkv, G, L, Ev), or (B, H, L, Ev)
    log_sum_exp = _masked_logsumexp(scores, mask) if lse else None
    if grouped:
        output, weights = output.flatten(1, 2), weights.flatten(1, 2)
        log_sum_exp = None if log_sum_exp is None else log_sum_exp.flatten(1, 2)
    return BackendResult(
        output=output.to(q.dtype) if cast else output,
        lse=log_sum_exp,  # (B, H, L)
        weights=weights.to(q.dtype) if cast else weights,
    )
