"""Batching: padding to (B, S) / (B, T) tensors and length-bucketed, seeded batch orders."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from .tokenizer import BOS, EOS, PAD

__all__ = ["Batch", "collate", "BatchSampler"]


class Batch(NamedTuple):
    """A padded batch. ``target_in`` starts with <bos>; ``target_out`` is it shifted, ending in <eos>."""

    source: Tensor  # (B, S) long, <pad>-filled
    source_lengths: Tensor  # (B,) long
    target_in: Tensor  # (B, T) long: <bos> y_1 ... y_{T-1}
    target_out: Tensor  # (B, T) long: y_1 ... y_{T-1} <eos>, <pad> after the end

    @property
    def source_mask(self) -> Tensor:
        """(B, S) boolean, True at real source tokens."""
        return torch.arange(self.source.shape[1], device=self.source.device) < self.source_lengths[:, None]

    def to(self, device: torch.device | str) -> Batch:
        """The batch on ``device`` (a model's: training and evaluation follow the model)."""
        return Batch(*(t.to(device) for t in self))

    @property
    def target_tokens(self) -> int:
        return int((self.target_out != PAD).sum())


def _pad(rows: Sequence[Sequence[int]]) -> Tensor:
    out = torch.full((len(rows), max(len(r) for r in rows)), PAD, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
    return out


def collate(sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]] | None = None) -> Batch:
    """Pad source id lists (no specials) and wrap target id lists (no specials) in <bos>/<eos>."""
    if not sources:
        raise ValueError("collate needs at least one example")
    if targets is not None and len(targets) != len(sources):
        raise ValueError(f"sources and targets differ in number: {len(sources)} and {len(targets)}")
    if any(len(s) == 0 for s in sources):
        raise ValueError("every source must have at least one token")
    source = _pad(sources)
    lengths = torch.tensor([len(s) for s in sources], dtype=torch.long)
    if targets is None:
        empty = torch.empty(len(sources), 0, dtype=torch.long)
        return Batch(source, lengths, empty, empty)
    target_in = _pad([[BOS, *t] for t in targets])
    target_out = _pad([[*t, EOS] for t in targets])
    return Batch(source, lengths, target_in, target_out)


class BatchSampler:
    """Batches of example indices of similar length, in a seeded order that differs per epoch.

    Examples are shuffled, then sorted by (source, target) length so that batches need little
    padding, cut into batches of ``batch_size``, and the batches are shuffled. The order depends
    only on (seed, epoch), so a resumed run sees the same batches. Under data parallelism every
    global batch is dealt round-robin to ``world_size`` ranks.
    """

    def __init__(self, lengths: Sequence[tuple[int, int]], batch_size: int, *, seed: int = 0) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not lengths:
            raise ValueError("no examples to batch")
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.seed = seed

    def __len__(self) -> int:
        return -(-len(self.lengths) // self.batch_size)

    def epoch(self, epoch: int, *, rank: int = 0, world_size: int = 1) -> list[list[int]]:
        """The batches of ``epoch``: this rank's share of each global batch."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        generator = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        order = torch.randperm(len(self.lengths), generator=generator).tolist()
        order.sort(key=lambda i: self.lengths[i])  # stable: ties keep the shuffled order
        batches = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        shuffled = torch.randperm(len(batches), generator=generator).tolist()
        return [batches[i][rank::world_size] for i in shuffled if batches[i][rank::world_size]]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.epoch(0))
