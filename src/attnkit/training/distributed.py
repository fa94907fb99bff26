"""Data parallelism: the same training command under ``torchrun --nproc_per_node N``."""

from __future__ import annotations

import os

import torch
from torch import distributed as dist

from ..distributed import world_rank

__all__ = ["setup_distributed", "world", "all_sum", "broadcast_text", "is_main"]


def setup_distributed() -> bool:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1): gloo on CPU, nccl on GPU."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return dist.is_initialized()
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return True


def world() -> tuple[int, int]:
    """(rank, world_size) in the default group; (0, 1) without a process group."""
    return world_rank()


def is_main() -> bool:
    return world()[0] == 0


def all_sum(value: float) -> float:
    """Sum a number over all ranks (itself without a process group)."""
    if world()[1] == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(tensor)
    return float(tensor)


def broadcast_text(text: str | None) -> str:
    """Rank 0's string on every rank (e.g. a tokenizer trained once)."""
    if world()[1] > 1:
        box = [text]
        dist.broadcast_object_list(box, src=0)
        text = box[0]
    if text is None:
        raise ValueError("broadcast_text: rank 0 has no text to send")
    return text
