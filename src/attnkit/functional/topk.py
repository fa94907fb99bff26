"""Attention over the keys each query selected: the second half of DeepSeek sparse attention (DSA,
DeepSeek-AI 2025, DeepSeek-V3.2), after an indexer chose the top-k keys of every query.

    o_i = sum_{j in K_i} softmax_j(q_i . k_j * scale) v_j,   K_i the (at most k) keys query i selected

Each block of queries attends in one of two ways, whichever costs less for that block (the numbers are the
same either way):

- **per query**: it gathers every query's selected keys and values, (B, Hkv, block, k, E + Ev), and
  attends over them; work grows with k, but the gathered copy is read once by a few query heads, so the
  time goes to memory traffic (1.0-23 times a GEMM's per score on a 2-core CPU, `_union_limit`);
- **over the union**: it gathers once the keys any of its queries selected (u of them), scores the block's
  queries against all u in one GEMM and masks each query to its own selection; work grows with u, which
  for a block of nearby queries stays close to k when their selections overlap (an indexer's usually do)
  and is at most S. Chosen where u <= k x (1 + 32 / G) (G query heads a key head), on the CPU only.

Either way memory beyond the output is one block's, bounded whatever S, and no L x S score matrix exists
(the weights are scattered into one only when asked for). The selection joins the call's other rules: a negative entry
is an empty slot, a repeated key counts once, a key after the query's aligned position is dropped with
``is_causal``, a padded key with ``key_mask``; a query left with no key gets zeros (attnkit's rule).
Gradients by autograd (through the gathers). The NaN rule is :func:`attnkit.attention`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from . import masks as _masks
from . import nan as _nan
from .attention import AttentionOutput, _heads
from .backends.common import group_heads
from .checks import check_qkv
from .precision import compute_dtype

__all__ = ["topk_attention", "GATHER_ELEMENTS", "UNION_SCORES"]

GATHER_ELEMENTS = 1 << 24
"""The keys and values a block of queries gathers, (B, Hkv, block, k, E + Ev) (E alone when the values are
the keys' first Ev numbers, as in MLA), hold about this many numbers (64 MiB in float32): the block is as
many queries as fit, at least one."""


UNION_SCORES = 1 << 22
"""A block of queries attended over the union of its selections scores (B, Hkv, G, block, u) numbers, about
this many (16 MiB in float32) at the largest union it takes: the block is as many queries as fit (the more
queries, the larger its GEMM), and never fewer than a per-query block."""


def topk_attention(q: Tensor, k: Tensor, v: Tensor, indices: Tensor, *, key_mask: Tensor | None = None,
                   is_causal: bool = False, causal_align: str = "top-left", scale: float | None = None,
                   need_weights: bool | Sequence[int] = False, mask: Tensor | None = None) -> AttentionOutput:
    """Each query attends only the keys ``indices`` lists for it.

    Shape legend: B batch, H query heads, Hkv key/value heads, L queries, S keys, E head dim, Ev value dim,
    K selected keys per query.

    Args:
        q: (B, H, L, E). k: (B, Hkv, S, E). v: (B, Hkv, S, Ev).
        indices: (B, L, K), one selection for every head (DeepSeek-V3.2's indexer), or (B, Hkv, L, K), one
            per key/value head; integers in [0, S), -1 for an empty slot.
        key_mask: (B, S) True at real keys (padding False).
        mask: boolean (B|1, 1, L|1, S), True where a query may attend, shared by the heads: a selected key it
            rules out is dropped (a per-head mask is refused: the selection is shared by the heads).
        is_causal, causal_align: as in :func:`attnkit.attention`: a selected key after the query's aligned
            position is dropped.
        scale: multiplies q . k (default 1 / sqrt(E)).
        need_weights: also return the weights (B, H, L, S), zero at every key not attended (the only
            L x S tensor, made only when asked); a sequence of head indices: those heads only.

    Returns:
        :class:`AttentionOutput`: output (B, H, L, Ev), weights or None, lse (B, H, L) (-inf for a query
        with no key).
    """
    dims = check_qkv(q, k, v)
    B, Hkv, L, S = dims.B, dims.Hkv, dims.L, dims.S
    heads = _heads(need_weights, dims.H)
    if not isinstance(indices, Tensor) or indices.dim() not in (3, 4) or indices.shape[0] != B or \
            indices.shape[-2] != L or (indices.dim() == 4 and indices.shape[1] != Hkv):
        shape = tuple(indices.shape) if isinstance(indices, Tensor) else type(indices).__name__
        raise ValueError(f"indices must have shape (B, L, K) = ({B}, {L}, K) or (B, Hkv, L, K) = ({B}, {Hkv}, {L}, K), "
                         f"got {shape}")
    if indices.is_floating_point() or indices.dtype == torch.bool:
        raise TypeError(f"indices must be integer key positions, got dtype {indices.dtype}")
    if indices.numel() and int(indices.max()) >= S:
        raise ValueError(f"indices must lie in [0, S={S}) or be -1 for an empty slot, got {int(indices.max())}")
    if key_mask is not None and (not isinstance(key_mask, Tensor) or tuple(key_mask.shape) != (B, S)
                                 or key_mask.dtype != torch.bool):
        got = (key_mask.dtype, tuple(key_mask.shape)) if isinstance(key_mask, Tensor) else type(key_mask).__name__
        raise ValueError(f"key_mask must be boolean of shape (B, S) = ({B}, {S}), got {got}")
    if mask is not None and (not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.dim() != 4
                             or mask.shape[0] not in (1, B) or mask.shape[1] != 1 or mask.shape[2] not in (1, L)
                             or mask.shape[3] != S):
        got = (mask.dtype, tuple(mask.shape)) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"mask must be boolean of shape (B|1, 1, L|1, S) = ({B}|1, 1, {L}|1, {S}), shared by the "
                         f"heads as the selection is, got {got}")
    if causal_align not in _masks.ALIGNMENTS:
        raise ValueError(f"causal_align must be one of {_masks.ALIGNMENTS}, got {causal_align!r}")
    scale = 1.0 / math.sqrt(dims.E) if scale is None else float(scale)
    poisoned = None
    if _nan.on():
        q, k, v, poisoned = _nan.guarded(q, k, v, dims.groups)
    selection = indices if indices.dim() == 4 else indices[:, None]  # (B, Hkv|1, L, K)
    offset = _masks.causal_offset(L, S, causal_align)
    acc = compute_dtype(q.dtype)
    q_g = group_heads(q, dims).to(acc)  # (B, Hkv, G, L, E)
    k_acc = k.to(acc)
    shared = _leading_slice(v, k)  # MLA's absorbed values: the first Ev numbers of every key, gathered once
    v_acc = k_acc[..., :dims.Ev] if shared else v.to(acc)
    # written block by block: memory beyond the output is one block's (its selection deduplicated there)
    output = q_g.new_empty(B, Hkv, dims.groups, L, dims.Ev)
    lse = q_g.new_empty(B, Hkv, dims.groups, L)
    weight = q_g.new_zeros(B, Hkv, dims.groups, L, S) if heads is not None else None
    gathered = dims.E if shared else dims.E + dims.Ev
    slots = selection.shape[-1]
    block = max(1, GATHER_ELEMENTS // max(1, B * Hkv * slots * gathered))  # queries gathered per query at once
    union_block = max(1, int(UNION_SCORES // max(1, B * Hkv * dims.groups * _union_limit(slots, dims.groups))))
    by_union = q.is_cpu  # the union's way: on the CPU only (measured there)
    outer = max(block, union_block) if by_union else block
    keys = (k_acc, v_acc, shared)
    for q0 in range(0, L, outer):
        q1 = min(L, q0 + outer)
        if by_union:  # repeats need no removal here: a key of the union is attended once
            safe, allowed = _allowed(selection[:, :, q0:q1].long(), _rows(q0, q1, offset, is_causal, q.device), key_mask,
                                     None if mask is None else _masks.mask_rows(mask, q0, q1))
            union, slot = _union(safe, allowed, S)
            if union.numel() <= _union_limit(slots, dims.groups):
                p, lse[..., q0:q1], output[..., q0:q1, :] = _attend_union(q_g[..., q0:q1, :], keys, union, slot, scale)
                if weight is not None:
                    weight[..., q0:q1, :] = weight[..., q0:q1, :].index_copy(-1, union, p)
                continue
        for s0 in range(q0, q1, block):
            s1 = min(q1, s0 + block)
            rows = _rows(s0, s1, offset, is_causal, q.device)
            safe, allowed = _allowed(_deduplicated(selection[:, :, s0:s1]), rows, key_mask,
                                     None if mask is None else _masks.mask_rows(mask, s0, s1))
            p, lse[..., s0:s1], output[..., s0:s1, :] = _attend_each(q_g[..., s0:s1, :], keys, safe, allowed, scale)
            if weight is not None:  # repeated slots hold 0
                weight[..., s0:s1, :] = weight[..., s0:s1, :].scatter_add(-1, safe[:, :, None].expand_as(p), p)
    weight = None if weight is None else weight.flatten(1, 2)[:, heads].to(q.dtype)
    out, row_lse, weight = _nan.marked(poisoned, output.flatten(1, 2).to(q.dtype), lse.flatten(1, 2), weight, heads)
    return AttentionOutput(output=out, weights=weight, lse=row_lse)


def _allowed(chosen: Tensor, rows: Tensor | None, key_mask: Tensor | None,
             block_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """A block's selection (B, Hkv|1, bq, K) made safe to index with (empty slots read key 0), and which slots
    attend their key: not empty, not after the query's aligned position ``rows`` (bq, 1), not padding, not
    ruled out by the block's rows of the call's mask (B|1, 1, bq|1, S)."""
    allowed = chosen >= 0
    if rows is not None:
        allowed = allowed & (chosen <= rows)
    safe = chosen.clamp(min=0)
    if key_mask is not None:
        allowed = allowed & key_mask.gather(1, safe.flatten(1)).view(safe.shape)
    if block_mask is not None:
        B, H, bq, _ = safe.shape
        allowed = allowed & block_mask.expand(B, H, bq, -1).gather(-1, safe)
    return safe, allowed


def _attend_each(q: Tensor, keys: tuple, safe: Tensor, allowed: Tensor, scale: float):
    """A block of queries q (B, Hkv, G, bq, E), each over the keys it selected, gathered per query: the weights
    (B, Hkv, G, bq, K) over its slots, the lse and the output (B, Hkv, G, bq, Ev)."""
    k, v, shared = keys
    k_sel = _gathered(k, safe)  # (B, Hkv, bq, K, E)
    v_sel = k_sel[..., :v.shape[-1]] if shared else _gathered(v, safe)  # (B, Hkv, bq, K, Ev)
    scores = torch.einsum("bhgqe,bhqke->bhgqk", q, k_sel) * scale
    p, lse = _softmax_and_lse(scores, allowed[:, :, None])  # the mask (B, Hkv|1, 1, bq, K)
    return p, lse, torch.einsum("bhgqk,bhqke->bhgqe", p, v_sel)


def _attend_union(q: Tensor, keys: tuple, union: Tensor, slot: Tensor, scale: float):
    """A block of queries q (B, Hkv, G, bq, E) against the union of their selections (u,), gathered once and
    scored in one GEMM, each query masked to its own slots (``slot``: their places in the union, -1 for none):
    the weights (B, Hkv, G, bq, u), the lse and the output (B, Hkv, G, bq, Ev)."""
    k, v, shared = keys
    B, Hkv, G, bq, E = q.shape
    k_union = k.index_select(2, union)  # (B, Hkv, u, E)
    v_union = k_union[..., :v.shape[-1]] if shared else v.index_select(2, union)
    if not union.numel():  # no query of the block attends any key: zeros and lse -inf (attnkit's rule), on the
        scores = q.reshape(B, Hkv, G * bq, E) @ k_union.transpose(-1, -2)  # graph (zero gradients), as each way
        return scores.view(B, Hkv, G, bq, 0), q.new_full((B, Hkv, G, bq), -math.inf), \
            (scores @ v_union).view(B, Hkv, G, bq, -1)
    selected = _masks.selected(slot, union.numel())  # (B, Hkv|1, bq, u)
    scores = (q.reshape(B, Hkv, G * bq, E) @ k_union.transpose(-1, -2)) * scale
    p, lse = _softmax_and_lse(scores.view(B, Hkv, G, bq, -1), selected[:, :, None])
    return p, lse, (p.reshape(B, Hkv, G * bq, -1) @ v_union).view(B, Hkv, G, bq, -1)


def _softmax_and_lse(scores: Tensor, allowed: Tensor) -> tuple[Tensor, Tensor]:
    """The masked softmax over the last dim and its log-sum-exp from one exponential: a row with no allowed
    score gives zeros and -inf; a NaN score stays (NaN propagates). The lse's gradient is the softmax (its
    maximum held constant)."""
    masked = scores.masked_fill(~allowed, float("-inf"))
    top = masked.amax(dim=-1, keepdim=True)
    shift = top.masked_fill(torch.isinf(top), 0.0).detach()
    exponentials = (masked - shift).exp()
    total = exponentials.sum(dim=-1, keepdim=True)
    p = exponentials / total.masked_fill(total == 0, 1.0)
    return p, (total.log() + shift).squeeze(-1)


def _union(safe: Tensor, allowed: Tensor, S: int) -> tuple[Tensor, Tensor]:
    """The keys a block of queries may attend, sorted (u,), and each slot's place among them, (B, Hkv|1, bq, K):
    -1 for a slot that attends nothing (an empty, causally dropped or padded one); a repeated key's slots share
    its place, so it counts once."""
    union, slot = torch.unique(safe.masked_fill(~allowed, S), sorted=True, return_inverse=True)
    if union.numel() and int(union[-1]) == S:  # the stand-in of the slots that attend nothing
        union = union[:-1]
    return union, slot.masked_fill(~allowed, -1)


def _union_limit(slots: int, groups: int) -> float:
    """The largest union a block of queries attends in one GEMM rather than gathering each query's ``slots``
    keys: about where that costs less. Measured on a 2-core CPU (``benchmarks/topk_union_cost.py``,
    ``benchmarks/results/topk_union_cost.json``: torch 2.13.0, E 576, the absorbed MLA shape, 2,048 slots of
    8,192 keys), a gathered score costs 22.8, 4.6, 1.9 and 1.0 GEMM scores with G = 1, 8, 32 and 128 query
    heads a key head (the gather's memory traffic is shared by fewer heads the smaller G is). 1 + 32 / G
    leans to the union: it takes unions 6% (G 32) to 45% (G 1) larger than where the two ways cost the
    same, so a block near the limit may cost that much more than its gathers would."""
    return slots * (1 + 32 / groups)


def _rows(q0: int, q1: int, offset: int, is_causal: bool, device) -> Tensor | None:
    """The aligned positions (q1 - q0, 1) of queries q0..q1-1, past which a causal query attends no key."""
    return torch.arange(q0, q1, device=device)[:, None] + offset if is_causal else None


def _deduplicated(indices: Tensor) -> Tensor:
    """``indices`` (B, h, L, K) as int64, sorted, every repeat of a key within a row made an empty slot (-1)."""
    ordered = indices.long().sort(dim=-1).values
    repeat = torch.zeros_like(ordered, dtype=torch.bool)
    repeat[..., 1:] = (ordered[..., 1:] == ordered[..., :-1]) & (ordered[..., 1:] >= 0)
    return ordered.masked_fill(repeat, -1)


def _leading_slice(v: Tensor, k: Tensor) -> bool:
    """Whether ``v`` is ``k[..., :Ev]``, the same memory (DeepSeek's absorbed attention: the values are the
    latent part of the keys), so one gather serves both."""
    return (v.device == k.device and v.dtype == k.dtype and v.data_ptr() == k.data_ptr()
            and v.shape[:-1] == k.shape[:-1] and v.shape[-1] <= k.shape[-1] and v.stride() == k.stride())


def _gathered(x: Tensor, index: Tensor) -> Tensor:
    """Rows of x (B, Hkv, S, D) at ``index`` (B, Hkv|1, bq, K): (B, Hkv, bq, K, D), by one index_select over
    the flattened rows (three times faster than a gather of the expanded index on the CPU)."""
    B, Hkv, S, D = x.shape
    index = index.expand(B, Hkv, *index.shape[2:])
    rows = torch.arange(B * Hkv, device=x.device).view(B, Hkv, 1, 1) * S + index  # (B, Hkv, bq, K)
    return x.reshape(B * Hkv * S, D).index_select(0, rows.flatten()).view(B, Hkv, *index.shape[2:], D)
