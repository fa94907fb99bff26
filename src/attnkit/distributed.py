"""Context parallelism, the public home: exact attention over a sequence split across the
processes of a ``torch.distributed`` group (ring attention or Ulysses), and what models need to run
that way. The code lives in the functional core: :mod:`attnkit.functional.context_parallel` (the
API, layouts, the ranks' agreement check, Ulysses) and :mod:`attnkit.functional.ring` (the ring's
exchange and its fused blocks). docs/distributed.md has the measurements and the arithmetic."""

from __future__ import annotations

from .functional.context_parallel import (
    LAYOUTS,
    METHODS,
    ContextParallel,
    PeerFailure,
    RankMismatch,
    all_reduce_gradients,
    check_context_parallel,
    context_parallel_attention,
    lm_shards,
    shard,
    shard_positions,
    unshard,
    world_rank,
)

__all__ = ["PeerFailure", "RankMismatch", "LAYOUTS", "METHODS", "shard_positions", "shard", "unshard",
           "context_parallel_attention", "ContextParallel", "check_context_parallel", "lm_shards",
           "all_reduce_gradients", "world_rank"]
