"""Context parallelism: exact attention over a sequence split across the processes of a
``torch.distributed`` group, and what models and training loops need to run that way.

Each of the W processes holds a shard of the sequence, (B, H, n / W, E) for the queries and
(B, Hkv, n / W, E) for keys and values, and gets its shard of exact attention over the whole
sequence:

- :mod:`.ring`: ring attention (Liu et al. 2023): the key/value shards travel around the ring, one
  hop per step, overlapped with each block (a fused kernel that returns the log-sum-exp,
  :mod:`attnkit.functional.partial`), merged by log-sum-exp in float32; gradients go round with
  their shard. Point-to-point ``batch_isend_irecv``: gloo on CPU, nccl on GPU.
- :mod:`.ulysses`: all-to-all from sequence shards to head shards and back (Jacobs et al. 2023).
- :mod:`.layouts`: which global positions a rank holds (contiguous, zigzag, striped).
- :mod:`.group`: which process am I, and do all the processes agree on a call (else
  :class:`RankMismatch` on every rank, never a hang).
- :mod:`.strategy`: :func:`context_parallel_attention`, and :class:`ContextParallel`, the strategy a
  layer or model is handed (``context_parallel=``); it answers the one call every attention strategy
  answers, so layers never branch on it.
- :mod:`.training`: :func:`lm_shards` and :func:`all_reduce_gradients`.

Process groups live here, never in :mod:`attnkit.functional`. docs/distributed.md has the
measurements and the arithmetic.
"""

from __future__ import annotations

from .group import RankMismatch, world_rank
from .layouts import LAYOUTS, shard, shard_positions, unshard
from .ring import PeerFailure
from .strategy import METHODS, ContextParallel, check_context_parallel, context_parallel_attention
from .training import all_reduce_gradients, lm_shards

__all__ = ["PeerFailure", "RankMismatch", "LAYOUTS", "METHODS", "shard_positions", "shard", "unshard",
           "context_parallel_attention", "ContextParallel", "check_context_parallel", "lm_shards",
           "all_reduce_gradients", "world_rank"]
