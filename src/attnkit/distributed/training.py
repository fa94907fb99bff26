"""What a training loop needs around context parallelism: label shards that match the input
shards, and gradients summed over the group."""

from __future__ import annotations

import torch
from torch import Tensor
from torch import distributed as dist

from .strategy import ContextParallel

__all__ = ["lm_shards", "all_reduce_gradients"]


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
