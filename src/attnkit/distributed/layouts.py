"""Which global positions each process of a context-parallel group holds (n divisible by W; by 2W
for zigzag):

- ``contiguous``: rank r holds positions [r n/W, (r+1) n/W);
- ``zigzag``: the sequence in 2W chunks, rank r holds chunks r and 2W - 1 - r, which balances
  causal work across ranks;
- ``striped``: rank r holds positions i with i mod W = r.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["LAYOUTS", "check_layout", "shard_positions", "shard", "unshard"]

LAYOUTS = ("contiguous", "zigzag", "striped")


def check_layout(n: int, world: int, layout: str) -> None:
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
    check_layout(n, world, layout)
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
