"""The "sdpa" backend: PyTorch's fused ``scaled_dot_product_attention``.

Structural masks that SDPA cannot express (bottom-right causal with L != S, sliding windows) are
materialised as a boolean mask. Fully masked rows are made zero whatever the PyTorch version does.
Learned sinks become one more key: a zero key and value whose additive mask column is the sink
logit of each head, so SDPA's softmax counts exp(sink) and the sink attends nothing.
Grouped keys and values (GQA) go to SDPA as they are only where its CUDA kernel reads them
(:func:`repeats_kv_on_cuda`); elsewhere on CUDA, a call without causal structure whose mask (if any) is
the same for every head of a group has each group's query heads folded into rows of its one key head
(:func:`folded`: no key or value copied, as MLA's absorbed decoding needs), and any other call repeats
keys and values per query head first.
Values narrower than the queries are padded to their width on the CPU (:func:`_widened`: the fused
kernel instead of the math path). A call under autograd whose bias puts a row's scores beyond what SDPA's float32 log-sum-exp resolves
(a row of -1e9) runs the reference backend's written-out softmax instead, whose gradients are exact.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import kept
from ..heads import repeat_kv
from ..tracing import exporting, traced
from . import reference
from .common import BackendResult, Problem, lse_unresolved, needs_grad

__all__ = ["forward", "plain", "masked"]


def repeats_kv_on_cuda(dtype: torch.dtype, head_dim: int, has_mask: bool) -> bool:
    """Whether a grouped-query call on CUDA must repeat keys and values per query head.

    Of SDPA's CUDA kernels only flash reads grouped heads (``enable_gqa``), and flash takes half
    types, head sizes up to 256 in multiples of 8, and no mask; PyTorch sends every other grouped
    call (float32, a padding mask) to its math path, which materialises the scores and cost 0.63 ms
    of host time per call in a decoding step on an H100 (docs/performance.md). Repeated keys and
    values reach the memory-efficient kernel instead, as transformers' sdpa attention does."""
    flash = dtype in (torch.float16, torch.bfloat16) and head_dim <= 256 and head_dim % 8 == 0 and not has_mask
    return not flash


def foldable(q: Tensor, attn_mask: Tensor | None, is_causal: bool) -> bool:
    """Whether a grouped call can fold each group's query heads into rows of its key head (:func:`folded`):
    no causal structure (it would differ between the folded rows), and no mask, or one shared by the heads
    (head dim 1) on a single query row, where folding repeats nothing (a longer mask would be copied G times).
    Not under torch.export with a dynamic query length: viewing the folded output back carries the length into a
    guard that refuses the declared range (torch 2.11 and 2.13 alike); the keys are repeated there instead."""
    if is_causal or q.dim() != 4 or (type(q.shape[2]) is not int and exporting()):
        return False
    return attn_mask is None or (attn_mask.dim() == 4 and attn_mask.shape[1] == 1 and q.shape[2] == 1)


def folded(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, options: dict) -> Tensor:
    """SDPA on grouped heads with the G query heads of each key head as G x L rows of that head: q (B, H, L, E)
    -> (B, Hkv, G L, E) against k (B, Hkv, S, E) as they are, the output back to (B, H, L, Ev). Every query row
    attends the same keys either way, so the result is the same; what differs is the memory read: the keys and
    values once, not G times (PyTorch's CUDA kernels other than flash take no grouped heads, and repeating
    MLA's one 576-wide latent key head for 128 query heads read 9 GB a decoding step at 32K tokens).
    Callers check :func:`foldable` first."""
    B, H, L, E = q.shape
    Hkv = k.shape[1]
    groups = H // Hkv
    if attn_mask is not None:  # (B|1, 1, 1, S): the one row serves every folded row
        attn_mask = attn_mask.expand(-1, -1, groups * L, -1)
    options = options | {"enable_gqa": False}
    out = F.scaled_dot_product_attention(q.reshape(B, Hkv, groups * L, E), k, v, attn_mask=attn_mask, **options)
    return out.reshape(B, H, L, v.shape[-1])


def _grouped(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, options: dict) -> tuple[Tensor, Tensor, dict]:
    """k and v for SDPA, and its options: repeated per query head where CUDA needs it."""
    if not options["enable_gqa"] or not q.is_cuda or not repeats_kv_on_cuda(q.dtype, q.shape[-1], attn_mask is not None):
        return k, v, options
    groups = q.shape[1] // k.shape[1]
    return repeat_kv(k, groups), repeat_kv(v, groups), options | {"enable_gqa": False}


def _sdpa(q: Tensor, k: Tensor, v: Tensor, options: dict, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
    if q.is_cpu:  # (no folding, no repeats: those are CUDA's)
        Ev = v.shape[-1]
        if Ev < q.shape[-1]:
            v = _widened(v, q.shape[-1])
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **options)[..., :Ev]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **options)
    if (options["enable_gqa"] and q.is_cuda and repeats_kv_on_cuda(q.dtype, q.shape[-1], attn_mask is not None)
            and foldable(q, attn_mask, is_causal)):
        return folded(q, k, v, attn_mask, options)
    k, v, options = _grouped(q, k, v, attn_mask, options)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **options)


def _widened(v: Tensor, width: int) -> Tensor:
    """v (..., Ev) padded with zeros to ``width`` = E: on the CPU, PyTorch's SDPA takes its fused (flash)
    kernel only when queries, keys and values are equally wide, and otherwise its math path, which
    materialises the L x S scores. The zero columns give zero outputs, sliced off. Measured on 2 cores
    (float32, causal): L = S = 2048, E 576, Ev 512 (MLA's absorbed shape) 0.65 s -> 0.38 s and 188 MB ->
    20 MB; E 128, Ev 64 0.20 s -> 0.09 s; with a boolean mask 1.0-1.3x; under autograd 1.1x."""
    return F.pad(v, (0, width - v.shape[-1]))


def plain(q: Tensor, k: Tensor, v: Tensor, scale: float | None, is_causal: bool, grouped: bool) -> Tensor:
    """SDPA for a plain call (no mask, bias, dropout; causal top-left or none): what
    :func:`attnkit.attention` hands it straight, without a Problem. ``scale`` None is SDPA's own
    default, 1/sqrt(E); keyword arguments are passed only where they differ from SDPA's defaults (each
    costs a quarter of a microsecond in a call of seven)."""
    if v.shape[-1] < q.shape[-1] and q.is_cpu:
        return plain(q, k, _widened(v, q.shape[-1]), scale, is_causal, grouped)[..., :v.shape[-1]]
    if grouped:
        if q.is_cuda and repeats_kv_on_cuda(q.dtype, q.shape[-1], False):
            if foldable(q, None, is_causal):
                return folded(q, k, v, None, {"scale": scale})
            groups = q.shape[1] // k.shape[1]
            return F.scaled_dot_product_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), is_causal=is_causal,
                                                  scale=scale)
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=True)
    if scale is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)


@functools.cache
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
    options: dict[str, Any] = dict(dropout_p=problem.dropout_p, scale=problem.scale, enable_gqa=dims.Hkv != dims.H)
    if problem.bias is not None and needs_grad(q, k, v, problem) and lse_unresolved(problem, q.device):
        # SDPA's backward would misread a row of huge scores (common.LSE_RESOLVED_BOUND): the same
        # softmax written out, differentiated by autograd (the scores materialised, as the bias is).
        return reference.forward(q, k, v, problem)
    if problem.sinks is not None:
        return _with_sinks(q, k, v, problem, options)
    top_left = problem.causal_align == "top-left" or dims.L == dims.S
    if problem.mask is None and problem.block_mask is None and problem.bias is None and problem.window is None:
        if not problem.is_causal or top_left:
            return BackendResult(_sdpa(q, k, v, options, is_causal=problem.is_causal))
    return BackendResult(masked(q, k, v, problem.dense_mask(q.device), problem.bias, options))


def masked(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None, options: dict) -> Tensor:
    """SDPA under a boolean ``mask`` (True = may attend) and an additive ``bias``: a row with no allowed key gives
    zeros whatever this PyTorch's SDPA does (attnkit's semantics). :func:`forward`'s last step, and what
    :func:`attnkit.attention` runs itself for a call with a mask and nothing else (``options``: SDPA's
    dropout_p, scale and enable_gqa)."""
    empty_rows = None
    compiling = traced()  # compiled or transformed: no probe, no look at the data (one graph; vmap's batches)
    if mask is not None and (compiling or not _zeroes_masked_rows("cpu" if q.is_cpu else q.device.type, q.dtype,
                                                                   bias is not None)):
        # Let SDPA attend everywhere on rows with no allowed key, then zero those rows. On the CPU,
        # look first (most masks have no empty row; the answer is kept on the mask); on an
        # accelerator, or compiled, always fill rather than wait for the device to answer.
        if not q.is_cpu or compiling or _has_empty_rows(mask):
            empty_rows = ~mask.any(dim=-1, keepdim=True)
            mask = mask | empty_rows
    attn_mask = mask
    if bias is not None:
        attn_mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
    output = _sdpa(q, k, v, options, attn_mask)
    if empty_rows is not None:
        output = output.masked_fill(empty_rows, 0.0)
    return output


@functools.cache
def cpu_returns_masked_rows_as_zeros(dtype: torch.dtype) -> bool:
    """Whether this PyTorch's CPU SDPA itself gives zeros for a row with no allowed key under a boolean mask, for
    ``dtype``: :func:`masked` then returns SDPA's output as it is, filling nothing over it (uncompiled: while
    compiling it fills, and this probe, which reads a result on the host, must not be traced). Kept per dtype:
    one lookup a call."""
    return _zeroes_masked_rows("cpu", dtype, False)


def _has_empty_rows(mask: Tensor) -> bool:
    """Whether a boolean CPU mask has a row with no allowed key: looked at once per mask and model call
    (:mod:`..kept`), so that the layers of a model, which share one padding mask, pay for one look; a mask
    rewritten between calls is looked at again."""
    return kept.get(mask, "empty_rows", lambda: not bool(mask.any(dim=-1).all()))


def _with_sinks(q: Tensor, k: Tensor, v: Tensor, problem: Problem, options: dict) -> BackendResult:
    """SDPA over S + 1 keys: the last is the sink (zero key and value, additive mask = sink logit)."""
    dims = problem.dims
    B, Hkv = dims.B, dims.Hkv
    k = torch.cat([k, k.new_zeros(B, Hkv, 1, dims.E)], dim=2)
    v = torch.cat([v, v.new_zeros(B, Hkv, 1, dims.Ev)], dim=2)
    additive = problem.bias
    if additive is not None and additive.dim() == 2:
        additive = additive[None, None]
    mask = problem.dense_mask(q.device)
    if mask is not None:
        mask = mask[None, None] if mask.dim() == 2 else mask
        base = additive if additive is not None else torch.zeros((), dtype=q.dtype, device=q.device)
        additive = base.masked_fill(~mask, float("-inf"))
    if additive is None:
        additive = torch.zeros(1, 1, 1, dims.S, dtype=q.dtype, device=q.device)
    rows, batch = additive.shape[2], additive.shape[0]
    additive = additive.expand(batch, dims.H, rows, dims.S)
    assert problem.sinks is not None  # called for calls with sinks only
    sink = problem.sinks.to(q.dtype).view(1, dims.H, 1, 1).expand(batch, dims.H, rows, 1)
    attn_mask = torch.cat([additive, sink], dim=-1)
    return BackendResult(_sdpa(q, k, v, options, attn_mask))
