"""Ring attention's exchange and its blocks: the key/value shards of a process group travel around
the ring one hop per step (``batch_isend_irecv``, posted before each block so that the transfer
overlaps it); each block is partial attention by a fused kernel that returns the log-sum-exp
(:mod:`attnkit.functional.partial`), merged in float32; the backward gives each block's gradients
from the merged output and log-sum-exp and sends dK, dV around the ring with their shard. The API is
:func:`attnkit.distributed.context_parallel_attention`."""

from __future__ import annotations

import torch
from torch import Tensor
from torch import distributed as dist

from ..functional.heads import repeat_kv
from ..functional.masks import causal_positions
from ..functional.partial import fused, merge_partial, partial_attention_backward, partial_attention_trusted
from ..functional.precision import accumulation_dtype

__all__ = ["PeerFailure", "QUERY_TILE", "ring_attention"]

QUERY_TILE = 1024  # queries per block, forward and backward: memory per step is tile x shard
WHOLE_RUN_PAIRS = 16  # at most this many (query run, key run) calls per block; more runs (striped) go by tiles


def _allowed(q_pos: Tensor, k_pos: Tensor, is_causal: bool, window: int | None) -> Tensor | None:
    """(Lq, Lk) boolean mask from global positions, or None when everything is allowed."""
    if not is_causal and window is None:
        return None
    return causal_positions(q_pos, k_pos, window)


def _bias(allowed: Tensor | None, key_mask: Tensor | None, dtype: torch.dtype) -> tuple[Tensor | None, bool]:
    """(additive bias (B or 1, 1, Lq, Lk) or None, is_causal) for one block from ``allowed``
    (Lq, Lk; None: everywhere) and ``key_mask`` (B, Lk, nonzero at real keys). A block allowed
    everywhere needs no bias; one whose mask is the top-left causal triangle (the diagonal blocks
    of a causal ring) passes ``is_causal`` so that the kernel skips the masked half."""
    causal = False
    if allowed is not None:
        if bool(allowed.all()):
            allowed = None
        elif allowed.shape[0] == allowed.shape[1] and torch.equal(allowed, torch.ones_like(allowed).tril()):
            allowed, causal = None, True
    if allowed is None and key_mask is None:
        return None, causal
    device = allowed.device if allowed is not None else key_mask.device  # type: ignore[union-attr]  # one is set
    ok = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)
    if allowed is not None:
        ok = ok & allowed[None, None]
    if key_mask is not None:
        ok = ok & key_mask.bool()[:, None, None, :]
    return torch.zeros(ok.shape, dtype=dtype, device=ok.device).masked_fill_(~ok, float("-inf")), causal


def _key_span(q_pos: Tensor, k_pos: Tensor, is_causal: bool, window: int | None):
    """(k0, k1, allowed): the slice [k0, k1) of a key shard that a query tile may attend (causal /
    window) and the tile's mask over it (None: all allowed); or None when it may attend none of
    it. The block is skipped, or cut to the part that matters."""
    allowed = _allowed(q_pos, k_pos, is_causal, window)
    if allowed is None:
        return 0, k_pos.shape[0], None
    columns = allowed.any(0).nonzero()
    if columns.numel() == 0:
        return None
    k0, k1 = int(columns[0]), int(columns[-1]) + 1
    return k0, k1, allowed[:, k0:k1]


class PeerFailure(RuntimeError):
    """A process of the group died or stopped answering during context-parallel attention."""


class _LocalGroup:
    """Stand-in for a one-process group when torch.distributed is not initialised."""


class _Ring:
    """Point-to-point hops around the ring of a process group."""

    def __init__(self, group):
        self.group = group
        if isinstance(group, _LocalGroup):
            self.world, self.rank = 1, 0
            return
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        ranks = dist.get_process_group_ranks(group) if group is not None else list(range(self.world))
        self.next = ranks[(self.rank + 1) % self.world]
        self.prev = ranks[(self.rank - 1) % self.world]

    def start(self, tensors: list[Tensor]) -> tuple[list, list[Tensor]]:
        """Post sends of ``tensors`` to the next rank and receives of the same shapes from the previous."""
        tensors = [t.contiguous() for t in tensors]  # (a model's k / v are transposed views)
        received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, r, self.prev, self.group) for r in received]
        try:
            return dist.batch_isend_irecv(ops), received
        except RuntimeError as error:
            raise self._failure(error) from error

    def _failure(self, error: Exception) -> PeerFailure:
        return PeerFailure(f"ring attention on rank {self.rank} of {self.world}: exchanging with ranks {self.prev} "
                           f"(previous) and {self.next} (next) failed; a process of the group died or timed out "
                           f"({type(error).__name__}: {str(error)[:200]})")

    def wait(self, requests) -> None:
        try:
            for request in requests:
                request.wait()
        except RuntimeError as error:
            raise self._failure(error) from error


def _runs(pos: Tensor) -> list[tuple[int, int, int]]:
    """(start, end, first position) of each maximal run of consecutive positions in ``pos`` (L,):
    one run for a contiguous shard, two for a zigzag one."""
    if pos.shape[0] == 0:
        return []
    breaks = ((pos[1:] - pos[:-1]) != 1).nonzero().flatten().tolist()
    starts = [0] + [b + 1 for b in breaks]
    return list(zip(starts, starts[1:] + [pos.shape[0]], pos[starts].tolist()))


def _tiles(q_pos: Tensor, k_pos: Tensor, is_causal: bool, window: int | None, key_mask: Tensor | None,
           dtype: torch.dtype, q_base: int = 0, k_base: int = 0):
    """Per query tile of a block: (q0, q1, k0, k1, bias, is_causal), the key slice the tile may
    attend and its mask; tiles that may attend nothing are left out."""
    for q0 in range(0, q_pos.shape[0], QUERY_TILE):  # one tile at a time: a mask is tile x shard at most
        q1 = min(q_pos.shape[0], q0 + QUERY_TILE)
        span = _key_span(q_pos[q0:q1], k_pos, is_causal, window)
        if span is None:
            continue  # causal / window rule out the whole block: no work
        k0, k1, allowed = span
        bias, causal = _bias(allowed, None if key_mask is None else key_mask[:, k0:k1], dtype)
        yield q_base + q0, q_base + q1, k_base + k0, k_base + k1, bias, causal


def _blocks(q_pos: Tensor, k_pos: Tensor, is_causal: bool, window: int | None, key_mask: Tensor | None,
            dtype: torch.dtype, whole: bool):
    """The kernel calls of a (query shard, key shard) block: (q0, q1, k0, k1, bias, is_causal).

    Without a window or key mask, each pair of position runs (a contiguous shard has one, a zigzag
    shard two) that causal attention allows wholly, or as the top-left triangle, is one call with
    no mask (the kernel keeps its scores on chip, and skips the masked half of a triangle); other
    pairs, every block with a window or key mask, blocks with many runs (a striped layout) and every
    block of the plain-PyTorch arithmetic (``whole=False``: its scores would be the whole block's)
    go by query tiles with a tile x keys mask."""
    unmasked = whole and window is None and key_mask is None
    if unmasked and not is_causal:
        yield 0, q_pos.shape[0], 0, k_pos.shape[0], None, False  # nothing masked: one call
        return
    q_runs = _runs(q_pos) if unmasked else []
    k_runs = _runs(k_pos) if q_runs else []
    if not q_runs or not k_runs or len(q_runs) * len(k_runs) > WHOLE_RUN_PAIRS:
        yield from _tiles(q_pos, k_pos, is_causal, window, key_mask, dtype)
        return
    for q0, q1, qa in q_runs:  # causal from here on
        for k0, k1, ka in k_runs:
            last_q, last_k = qa + q1 - q0 - 1, ka + k1 - k0 - 1
            if qa >= last_k:
                yield q0, q1, k0, k1, None, False  # every query after every key
            elif last_q < ka:
                continue  # every key after every query: nothing
            elif qa == ka and last_q == last_k:
                yield q0, q1, k0, k1, None, True  # the same positions: the causal triangle
            else:
                yield from _tiles(q_pos[q0:q1], k_pos[k0:k1], is_causal, None, None, dtype, q0, k0)


def _forward_step(q: Tensor, ke: Tensor, ve: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float, is_causal: bool,
                  window: int | None, key_mask: Tensor | None, out: Tensor, lse: Tensor) -> None:
    """One ring step: attention of this rank's queries over one key shard (keys and values repeated
    to the query heads), merged into the running ``out`` and ``lse`` in place."""
    for q0, q1, k0, k1, bias, causal in _blocks(q_pos, k_pos, is_causal, window, key_mask, q.dtype, fused(q) is not None):
        part = partial_attention_trusted(q[:, :, q0:q1], ke[:, :, k0:k1], ve[:, :, k0:k1], scale, bias, causal)
        out[:, :, q0:q1], lse[:, :, q0:q1] = merge_partial(out[:, :, q0:q1], lse[:, :, q0:q1], *part)


def _backward_step(d_out: Tensor, q: Tensor, ke: Tensor, ve: Tensor, out: Tensor, safe_lse: Tensor, q_pos: Tensor,
                   k_pos: Tensor, scale: float, is_causal: bool, window: int | None, key_mask: Tensor | None,
                   dq: Tensor) -> tuple[Tensor, Tensor]:
    """One backward ring step: adds this key shard's share to ``dq`` in place and returns the shard's
    (dk, dv) at the query heads, in the accumulator dtype."""
    dke = torch.zeros_like(ke, dtype=dq.dtype)
    dve = torch.zeros_like(ve, dtype=dq.dtype)
    for q0, q1, k0, k1, bias, causal in _blocks(q_pos, k_pos, is_causal, window, key_mask, q.dtype, fused(q) is not None):
        dqi, dki, dvi = partial_attention_backward(
            d_out[:, :, q0:q1], q[:, :, q0:q1], ke[:, :, k0:k1], ve[:, :, k0:k1], out[:, :, q0:q1],
            safe_lse[:, :, q0:q1], scale, bias, causal)
        dq[:, :, q0:q1] += dqi
        dke[:, :, k0:k1] += dki
        dve[:, :, k0:k1] += dvi
    return dke, dve


class _RingAttention(torch.autograd.Function):
    """Ring attention; each block by :func:`attnkit.functional.partial.partial_attention` (a fused
    kernel that returns the log-sum-exp), merged by log-sum-exp in float32 (float64 for float64)."""

    @staticmethod
    def forward(ctx, q, k, v, q_pos, scale, is_causal, window, group, key_mask):
        ring = _Ring(group)
        groups = q.shape[1] // k.shape[1]
        acc = accumulation_dtype(q.dtype)
        B, H, L, _ = q.shape
        out = torch.zeros(B, H, L, v.shape[-1], dtype=acc, device=q.device)
        lse = torch.full((B, H, L), float("-inf"), dtype=acc, device=q.device)
        current = [k, v, q_pos] + ([key_mask] if key_mask is not None else [])  # what travels the ring
        for step in range(ring.world):
            pending = ring.start(current) if step < ring.world - 1 else None  # the next block's hop overlaps this one
            ck, cv, k_pos = current[:3]
            _forward_step(q, repeat_kv(ck, groups), repeat_kv(cv, groups), q_pos, k_pos, scale, is_causal, window,
                          current[3] if key_mask is not None else None, out, lse)
            if pending is not None:
                ring.wait(pending[0])
                current = pending[1]
        ctx.save_for_backward(q, k, v, q_pos, out, lse, key_mask)
        ctx.scale, ctx.is_causal, ctx.window, ctx.group = scale, is_causal, window, group
        return out.to(q.dtype), lse

    @staticmethod
    def backward(ctx, d_out, d_lse):
        q, k, v, q_pos, out, lse, key_mask = ctx.saved_tensors
        scale, is_causal, window = ctx.scale, ctx.is_causal, ctx.window
        ring = _Ring(ctx.group)
        groups = q.shape[1] // k.shape[1]
        acc = out.dtype
        safe_lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)  # rows with no key: out 0, nothing flows
        dq = torch.zeros_like(q, dtype=acc)
        carried = [k, v, q_pos] + ([key_mask] if key_mask is not None else [])
        in_flight = None  # the previous step's key/value gradients, on their way here
        for step in range(ring.world):
            last = step == ring.world - 1
            pending = ring.start(carried) if not last else None  # the next shard's hop overlaps this block
            ck, cv, k_pos = carried[:3]
            dke, dve = _backward_step(d_out, q, repeat_kv(ck, groups), repeat_kv(cv, groups), out, safe_lse, q_pos, k_pos,
                                      scale, is_causal, window, carried[3] if key_mask is not None else None, dq)
            if groups > 1:
                Bk, Hq, S, E = dke.shape
                dke = dke.view(Bk, Hq // groups, groups, S, E).sum(2)
                dve = dve.view(Bk, Hq // groups, groups, S, dve.shape[-1]).sum(2)
            grads = [dke, dve]
            if in_flight is not None:  # this shard's gradients from the ranks it visited before
                ring.wait(in_flight[0])
                grads = [g + r for g, r in zip(grads, in_flight[1])]
            if ring.world > 1:  # they travel with their shard and arrive home after W hops; the
                in_flight = ring.start(grads)  # hop overlaps the next step's block
            if pending is not None:
                ring.wait(pending[0])
                carried = pending[1]
        if in_flight is not None and ring.world > 1:
            ring.wait(in_flight[0])
            grads = in_flight[1]
        dk, dv = grads
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None


def ring_attention(q: Tensor, k: Tensor, v: Tensor, positions: Tensor, scale: float, is_causal: bool,
                   window: int | None, group, key_mask: Tensor | None, *, distributed: bool = True) -> Tensor:
    """This rank's shard of exact attention by the ring over ``group`` (None: the world), or, with
    ``distributed=False`` (torch.distributed not initialised), one process's plain attention;
    arguments as :func:`~attnkit.distributed.context_parallel_attention` checks them."""
    out, _ = _RingAttention.apply(q, k, v, positions, scale, is_causal, window,
                                  group if distributed else _LocalGroup(), key_mask)
    return out
