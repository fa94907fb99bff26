"""The process group of a context-parallel call: which process am I, of how many, and do all the
processes agree on the call (one small all_gather before any other transfer)."""

from __future__ import annotations

import hashlib

import torch
from torch import distributed as dist

from .ring import PeerFailure

__all__ = ["world_rank", "RankMismatch", "check_agreement", "collective_device", "summed", "exchanged"]


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


def collective_device(group, device: torch.device) -> torch.device:
    """Where a small collective's tensor must live: NCCL takes CUDA tensors only, gloo CPU ones."""
    return device if dist.get_backend(group) == "nccl" else torch.device("cpu")


def check_agreement(group, world: int, rank: int, signature: dict, device: torch.device | None = None) -> None:
    """Every rank's shapes and options, gathered in one small all_gather (|signature| int64 per
    rank) before any other transfer: a mismatch raises :class:`RankMismatch` on every rank, naming
    each option that differs and its value per rank, instead of wrong numbers, a gloo abort or a
    hang. Done on every call: a rank cannot know whether another changed its options without
    asking, and a cache that let one rank skip the gather while another gathers would hang."""
    codes = torch.tensor([_code(value) for value in signature.values()], dtype=torch.int64,
                         device=collective_device(group, device or torch.device("cpu")))
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


def summed(x: torch.Tensor, group=None) -> torch.Tensor:
    """``x`` summed over the ranks of ``group``, differentiable (the gradient is the gradients summed the
    same way): torch's functional collectives, which replace ``torch.distributed.nn``'s deprecated ones."""
    from torch.distributed import _functional_collectives as collectives

    group = group if group is not None else dist.group.WORLD
    return collectives.wait_tensor(collectives.all_reduce(x, "sum", group))


def exchanged(chunks: torch.Tensor, group=None) -> torch.Tensor:
    """All-to-all of ``chunks`` (W, ...): rank r receives every rank's chunk r, in rank order,
    differentiable (its gradient is the inverse exchange)."""
    from torch.distributed import _functional_collectives as collectives

    group = group if group is not None else dist.group.WORLD
    return collectives.wait_tensor(collectives.all_to_all_single_autograd(chunks, None, None, group))
