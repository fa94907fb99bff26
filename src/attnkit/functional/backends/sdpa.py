"""The "sdpa" backend: PyTorch's fused ``scaled_dot_product_attention``.

Structural masks that SDPA cannot express (bottom-right causal with L != S, sliding windows) are
materialised as a boolean mask. Fully masked rows are made zero whatever the PyTorch version does.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from ._common import BackendResult, Problem

__all__ = ["forward"]


@functools.lru_cache(maxsize=None)
def _zeroes_masked_rows(device_type: str, dtype: torch.dtype, float_mask: bool) -> bool:
    """Whether this PyTorch's SDPA already returns 0 (not NaN) for a fully masked query row."""
    q = torch.ones(1, 1, 2, 8, device=device_type, dtype=dtype)
    mask = torch.tensor([[True, True], [False, False]], device=device_type)
    if float_mask:
        mask = torch.zeros(2, 2, device=device_type, dtype=dtype).masked_fill(~mask, float("-inf"))
    out = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    return bool((out[0, 0, 1] == 0).all())


def forward(q: Tensor, k: Tensor, v: Tensor, problem: Problem) -> BackendResult:
    dims = problem.dims
    if problem.score_mod is not None:
        raise ValueError("the sdpa backend cannot apply a score_mod; use backend='tiled' (or 'reference')")
    options = dict(dropout_p=problem.dropout_p, scale=problem.scale, enable_gqa=dims.Hkv != dims.H)
    top_left = problem.causal_align == "top-left" or dims.L == dims.S
    if problem.mask is None and problem.block_mask is None and problem.bias is None and problem.window is None:
        if not problem.is_causal or top_left:
            return BackendResult(F.scaled_dot_product_attention(q, k, v, is_causal=problem.is_causal, **options))
    mask = problem.dense_mask(q.device)
    empty_rows = None
    if mask is not None and not _zeroes_masked_rows(q.device.type, q.dtype, problem.bias is not None):
        # Let SDPA attend everywhere on rows with no allowed key, then zero those rows.
        has_key = mask.any(dim=-1, keepdim=True)
        if not bool(has_key.all()):
            empty_rows = ~has_key
            mask = mask | empty_rows
    attn_mask = mask
    if problem.bias is not None:
        attn_mask = problem.bias if mask is None else problem.bias.masked_fill(~mask, float("-inf"))
    output = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **options)
    if empty_rows is not None:
        output = output.masked_fill(empty_rows, 0.0)
    return BackendResult(output)
