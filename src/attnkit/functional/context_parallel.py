"""Context parallelism: exact attention over a sequence split across processes (torch.distributed).

Each of the W processes of a group holds a shard of the sequence, (B, H, n / W, E) for the
queries and (B, Hkv, n / W, E) for keys and values, and gets its shard of exact attention over the
whole sequence. Ring attention (Liu et al. 2023): the key/value shards travel around the ring of
processes, one hop per step, while each process attends its queries to the shard it holds (a
fused kernel that returns the log-sum-exp: :mod:`attnkit.functional.partial`) and merges the
partial results by log-sum-exp (float32). The backward pass gives each block's gradients from the
saved output and log-sum-exp and sends the key/value gradients around the ring with their shard,
so they arrive home after W hops. Communication is torch.distributed point-to-point
(``batch_isend_irecv``; gloo on CPU, nccl on GPU), posted before each block is computed so that
it can overlap with it.

Layouts (which global positions a rank holds), for n divisible by W (2W for zigzag):

- ``contiguous``: rank r holds positions [r n/W, (r+1) n/W);
- ``zigzag``: the sequence in 2W chunks, rank r holds chunks r and 2W - 1 - r, which balances
  causal work across ranks;
- ``striped``: rank r holds positions i with i mod W = r.

Ulysses (Jacobs et al. 2023, DeepSpeed): an all-to-all turns sequence shards into head shards
(each rank gets H / W heads of the whole sequence), attention runs locally with any attnkit
backend, and a second all-to-all turns the result back; autograd through
``torch.distributed.nn.functional.all_to_all_single``. It needs W to divide the heads (key/value
heads are repeated when W does not divide them) and moves q, k, v and the output once each.

Masks follow from global positions: ``is_causal`` (key j <= query i) and ``window`` (causal
sliding window, i - window < j <= i), so every layout gives the same numbers.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch
from torch import Tensor
from torch import distributed as dist

from .checks import check_int
from .heads import repeat_kv
from .ring import PeerFailure, ring_attention

__all__ = ["PeerFailure", "RankMismatch", "LAYOUTS", "METHODS", "shard_positions", "shard", "unshard",
           "context_parallel_attention", "ContextParallel", "check_context_parallel", "lm_shards",
           "all_reduce_gradients", "world_rank"]

LAYOUTS = ("contiguous", "zigzag", "striped")
METHODS = ("ring", "ulysses")


def _check_layout(n: int, world: int, layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    multiple = 2 * world if layout == "zigzag" else world
    if n % multiple:
        raise ValueError(f"sequence length {n} must be a multiple of {multiple} for layout {layout!r} with "
                         f"{world} processes; pad it (and mask the padding) to {math.ceil(n / multiple) * multiple}")


def shard_positions(n: int, world: int, rank: int, layout: str = "zigzag") -> Tensor:
    """The global positions (n / W,) that ``rank`` holds under ``layout``, in shard order."""
    _check_layout(n, world, layout)
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world}), got {rank}")
    if layout == "contiguous":
        size = n // world
        return torch.arange(rank * size, (rank + 1) * size)
    if layout == "striped":
        return torch.arange(rank, n, world)
    chunk = n // (2 * world)
    first, second = rank, 2 * world - 1 - rank
    return torch.cat([torch.arange(first * chunk, (first + 1) * chunk), torch.arange(second * chunk, (second + 1) * chunk)])


def shard(x: Tensor, world: int, rank: int, *, layout: str = "zigzag", dim: int = -2) -> Tensor:
    """The part of a whole-sequence tensor that ``rank`` holds (sequence along ``dim``)."""
    return x.index_select(dim, shard_positions(x.shape[dim], world, rank, layout).to(x.device))


def unshard(shards: list[Tensor], *, layout: str = "zigzag", dim: int = -2) -> Tensor:
    """The whole-sequence tensor from every rank's shard (rank order), e.g. after all_gather."""
    world = len(shards)
    n = sum(s.shape[dim] for s in shards)
    order = torch.cat([shard_positions(n, world, r, layout) for r in range(world)])
    stacked = torch.cat(shards, dim=dim)
    return stacked.index_select(dim, torch.argsort(order).to(stacked.device))


def world_rank(group=None) -> tuple[int, int]:
    """(rank, world size) in ``group`` (default: the world); (0, 1) when torch.distributed is not
    initialised. The one helper for "which process am I, of how many"."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1


class RankMismatch(ValueError):
    """The processes of a group called context-parallel attention with different shapes or options."""


def _code(value) -> int:
    """One int64 per option, equal across processes exactly when the options are equal."""
    if value is None:
        return -1
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(torch.tensor([value], dtype=torch.float64).view(torch.int64))
    return int.from_bytes(hashlib.blake2b(str(value).encode(), digest_size=7).digest(), "little")


def _collective_device(group, device: torch.device) -> torch.device:
    """Where a small collective's tensor must live: NCCL takes CUDA tensors only, gloo CPU ones."""
    return device if dist.get_backend(group) == "nccl" else torch.device("cpu")


def _check_agreement(group, world: int, rank: int, signature: dict, device: torch.device | None = None) -> None:
    """Every rank's shapes and options, gathered in one small all_gather (|signature| int64 per
    rank) before any other transfer: a mismatch raises :class:`RankMismatch` on every rank, naming
    each option that differs and its value per rank, instead of wrong numbers, a gloo abort or a
    hang. Done on every call: a rank cannot know whether another changed its options without
    asking, and a cache that let one rank skip the gather while another gathers would hang."""
    codes = torch.tensor([_code(value) for value in signature.values()], dtype=torch.int64,
                         device=_collective_device(group, device or torch.device("cpu")))
    gathered = [torch.empty_like(codes) for _ in range(world)]
    try:
        dist.all_gather(gathered, codes, group=group)
    except RuntimeError as error:
        raise PeerFailure(f"context-parallel attention on rank {rank} of {world}: checking that the ranks agree "
                          f"failed ({type(error).__name__}: {str(error)[:200]})") from error
    table = torch.stack(gathered)  # (world, options)
    differing = (table != table[0]).any(dim=0).tolist()
    if any(differing):
        names = [name for name, bad in zip(signature, differing) if bad]
        raise RankMismatch(f"context-parallel attention: the {world} processes disagree on "
                           + ", ".join(names) + f"; this rank ({rank}) has "
                           + ", ".join(f"{name}={signature[name]!r}" for name in names)
                           + "; every process must pass the same shapes and options")


def _seq_to_heads(x: Tensor, world: int, group) -> Tensor:
    """(B, H, Lr, E) sequence shard -> (B, H / W, W * Lr, E): my head group, every rank's shard in rank order."""
    from torch.distributed.nn.functional import all_to_all_single

    B, H, L, E = x.shape
    chunks = x.reshape(B, world, H // world, L, E).permute(1, 0, 2, 3, 4).contiguous()
    received = all_to_all_single(torch.empty_like(chunks), chunks, group=group)
    return received.permute(1, 2, 0, 3, 4).reshape(B, H // world, world * L, E)


def _heads_to_seq(x: Tensor, world: int, group) -> Tensor:
    """Inverse of :func:`_seq_to_heads`: (B, H / W, W * Lr, E) -> (B, H, Lr, E)."""
    from torch.distributed.nn.functional import all_to_all_single

    B, h, n, E = x.shape
    L = n // world
    chunks = x.reshape(B, h, world, L, E).permute(2, 0, 1, 3, 4).contiguous()
    received = all_to_all_single(torch.empty_like(chunks), chunks, group=group)
    return received.permute(1, 0, 2, 3, 4).reshape(B, world * h, L, E)


def _ulysses(q, k, v, positions, scale, is_causal, window, group, backend, key_mask):
    from .attention import attention

    world = dist.get_world_size(group)
    H, Hkv = q.shape[1], k.shape[1]
    if H % world:
        raise ValueError(f"method='ulysses' needs the {world} processes to divide the {H} query heads; use method='ring'")
    if Hkv % world:  # repeat key/value heads so that every rank gets whole groups
        k, v = repeat_kv(k, H // Hkv), repeat_kv(v, H // Hkv)
    gathered = [torch.empty_like(positions) for _ in range(world)]
    dist.all_gather(gathered, positions, group=group)
    order = torch.argsort(torch.cat(gathered))  # rank-concatenated order -> global order
    inverse = torch.argsort(order)
    qh, kh, vh = (_seq_to_heads(x, world, group).index_select(2, order) for x in (q, k, v))
    mask = None
    if key_mask is not None:  # every rank needs every key's mask: (B, n) in global order
        masks = [torch.empty_like(key_mask) for _ in range(world)]
        dist.all_gather(masks, key_mask.contiguous(), group=group)
        mask = torch.cat(masks, dim=1).index_select(1, order).bool()[:, None, None, :]
    out = attention(qh, kh, vh, mask=mask, is_causal=is_causal, window=window, scale=scale, backend=backend).output
    return _heads_to_seq(out.index_select(2, inverse).contiguous(), world, group)


def context_parallel_attention(
    q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool = False, window: int | None = None,
    layout: str = "zigzag", method: str = "ring", scale: float | None = None, group=None,
    positions: Tensor | None = None, backend: str = "tiled", key_mask: Tensor | None = None,
) -> Tensor:
    """This process's shard (B, H, n / W, Ev) of exact attention over the whole sequence, by ring
    attention or Ulysses across the processes of ``group`` (default: the world). ``backend`` is
    the attnkit backend Ulysses computes its heads with (the ring computes its blocks itself).

    ``q`` (B, H, n / W, E), ``k`` / ``v`` (B, Hkv, n / W, E|Ev) are this rank's shards under
    ``layout`` (see :func:`shard`); H % Hkv == 0 (GQA). ``is_causal`` and ``window`` (causal
    sliding window) apply to global positions. ``key_mask`` (B, n / W), True (or nonzero) at this
    shard's real tokens, rules out padding keys wherever their queries are (it travels the ring
    with the keys; Ulysses gathers it); a query with no allowed key gets zeros. Gradients flow to
    q, k and v exactly. Without an initialised process group this is plain attention on one process.
    """
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q, k, v must be (B, H, L, E), got shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"shards must share batch and length, q and k the head dim: q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads {q.shape[1]} must be a multiple of key/value heads {k.shape[1]}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    check_int("window", window, 1, optional=True)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    initialised = dist.is_available() and dist.is_initialized()
    rank, world = world_rank(group)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if initialised and world > 1:
        _check_agreement(group, world, rank, dict(
            batch=q.shape[0], query_heads=q.shape[1], kv_heads=k.shape[1], shard_length=q.shape[2],
            head_dim=q.shape[3], value_dim=v.shape[3], is_causal=bool(is_causal), window=window,
            layout=layout, method=method, scale=scale, key_mask=key_mask is not None, dtype=q.dtype,
            backend=backend, positions=positions is not None), q.device)
    if positions is None:
        positions = shard_positions(q.shape[2] * world, world, rank, layout)
    positions = positions.to(q.device)
    if positions.shape != (q.shape[2],):
        raise ValueError(f"positions must be ({q.shape[2]},) for this shard, got {tuple(positions.shape)}")
    if key_mask is not None:
        if tuple(key_mask.shape) != (q.shape[0], q.shape[2]) or key_mask.is_floating_point():
            raise ValueError(f"key_mask must be boolean or integer of shape (B, n / W) = ({q.shape[0]}, {q.shape[2]}), "
                             f"got {key_mask.dtype} {tuple(key_mask.shape)}")
        key_mask = (key_mask != 0).to(torch.uint8).to(q.device)  # uint8: gloo sends no bool tensors
    if method == "ulysses" and initialised and world > 1:
        return _ulysses(q, k, v, positions, scale, is_causal, window, group, backend, key_mask)
    return ring_attention(q, k, v, positions, scale, is_causal, window, group, key_mask, distributed=initialised)


@dataclass(frozen=True)
class ContextParallel:
    """How a model runs with its sequence split across the processes of ``group`` (default: the
    world): pass it as ``context_parallel=`` to :class:`~attnkit.models.DecoderLM` or
    :class:`~attnkit.models.EncoderModel` (and so to their :class:`~attnkit.layers.MultiHeadAttention`
    layers), each process giving its shard of the batch's tokens. Positions (rotary or learned) come
    from the shard's global positions; every self-attention is :func:`context_parallel_attention`.
    Everything else in a Transformer (embeddings, norms, MLPs, the output layer) works per token and
    needs no communication."""

    layout: str = "zigzag"
    method: str = "ring"
    group: object = None

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"ContextParallel.layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.method not in METHODS:
            raise ValueError(f"ContextParallel.method must be one of {METHODS}, got {self.method!r}")

    @property
    def world(self) -> int:
        return world_rank(self.group)[1]

    @property
    def rank(self) -> int:
        return world_rank(self.group)[0]

    def positions(self, shard_length: int) -> Tensor:
        """The global positions (shard_length,) this process holds."""
        return shard_positions(shard_length * self.world, self.world, self.rank, self.layout)

    def shard(self, x: Tensor, dim: int = 1) -> Tensor:
        """This process's part of a whole-sequence tensor (sequence along ``dim``)."""
        return shard(x, self.world, self.rank, layout=self.layout, dim=dim)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, *, positions: Tensor, is_causal: bool = False,
                  window: int | None = None, scale: float | None = None, key_mask: Tensor | None = None) -> Tensor:
        """:func:`context_parallel_attention` with this layout, method and group."""
        return context_parallel_attention(q, k, v, is_causal=is_causal, window=window, layout=self.layout,
                                          method=self.method, scale=scale, group=self.group, positions=positions,
                                          key_mask=key_mask)


def check_context_parallel(value, name: str = "context_parallel") -> ContextParallel | None:
    """``value`` if it is None or a :class:`ContextParallel`; else a TypeError naming ``name``."""
    if value is not None and not isinstance(value, ContextParallel):
        raise TypeError(f"{name} must be an attnkit.distributed.ContextParallel or None, got {type(value).__name__}")
    return value


def lm_shards(input_ids: Tensor, cp: ContextParallel, ignore_index: int = -100) -> tuple[Tensor, Tensor]:
    """(input shard, label shard) of a language-model batch (B, n): the labels are the next tokens
    of the whole sequence (``ignore_index`` after the last), shifted before sharding, so that a
    token's label is on the same process as the token even when its successor is not."""
    labels = torch.full_like(input_ids, ignore_index)
    labels[:, :-1] = input_ids[:, 1:]
    return cp.shard(input_ids), cp.shard(labels)


def all_reduce_gradients(parameters, group=None) -> None:
    """Sum every parameter's gradient over the processes of ``group`` (each process's loss being
    its part of the global loss, the sum is the global gradient). DistributedDataParallel does the
    same with a mean: scale the loss by the world size there."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    grads = [p.grad for p in parameters if p.grad is not None]
    if grads:
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset: offset + g.numel()].view_as(g))
            offset += g.numel()
