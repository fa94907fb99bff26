"""Context parallelism as a strategy: exact attention over a sequence split across the processes of a
``torch.distributed`` group, by ring attention (:mod:`.ring`) or Ulysses (:mod:`.ulysses`).

:func:`context_parallel_attention` is the functional call; :class:`ContextParallel` is the same as
a strategy a layer is handed (``MultiHeadAttention(..., context_parallel=cp)``, or a model's
``context_parallel=``): it answers the one call every attention strategy answers
(:meth:`ContextParallel.attend`, like the KV caches), so the layer has one path.

Masks follow from global positions: ``is_causal`` (key j <= query i) and ``window`` (causal
sliding window, i - window < j <= i), so every layout gives the same numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor
from torch import distributed as dist

from ..functional.attention import AttentionOutput
from ..functional.checks import check_int
from .group import check_agreement, world_rank
from .layouts import LAYOUTS, shard, shard_positions
from .ring import ring_attention
from .ulysses import ulysses_attention

__all__ = ["METHODS", "context_parallel_attention", "ContextParallel", "check_context_parallel"]

METHODS = ("ring", "ulysses")


def context_parallel_attention(
    q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool = False, window: int | None = None,
    layout: str = "zigzag", method: str = "ring", scale: float | None = None, group=None,
    positions: Tensor | None = None, backend: str = "auto", key_mask: Tensor | None = None,
) -> AttentionOutput:
    """This process's shard of exact attention over the whole sequence, as :class:`AttentionOutput`
    (output (B, H, n / W, Ev); no weights, no lse), by ring
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
        check_agreement(group, world, rank, dict(
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
        output = ulysses_attention(q, k, v, positions, scale, is_causal, window, group, backend, key_mask)
    else:
        output = ring_attention(q, k, v, positions, scale, is_causal, window, group, key_mask, distributed=initialised)
    return AttentionOutput(output=output)


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
                  window: int | None = None, scale: float | None = None, key_mask: Tensor | None = None
                  ) -> AttentionOutput:
        """:func:`context_parallel_attention` with this layout, method and group."""
        return context_parallel_attention(q, k, v, is_causal=is_causal, window=window, layout=self.layout,
                                          method=self.method, scale=scale, group=self.group, positions=positions,
                                          key_mask=key_mask)

    def attend(self, layer, q: Tensor, key: Tensor, value: Tensor, call) -> AttentionOutput:
        """The attention strategy's one call (as the caches'): ``layer``'s self attention over the whole
        sequence, ``q`` (B, H, L, E) this shard's queries, ``key`` / ``value`` (B, L, D) its inputs,
        ``call`` the layer's options (:class:`attnkit.layers.AttentionCall`): ``positions`` (L,) the
        shard's global positions (default: the layout's), ``key_mask`` (B, L) the shard's padding; no
        mask, bias, weights or attention dropout."""
        B, L = q.shape[0], q.shape[2]
        if not call.self_attention:
            raise ValueError("context_parallel is for self attention: give query only")
        if call.bias is not None or call.need_weights:
            raise ValueError("context_parallel takes no cache, bias or need_weights")
        options = layer.attention_options()
        if options["dropout_p"] > 0:
            raise ValueError(f"context_parallel has no attention dropout (this layer's is {options['dropout_p']}); "
                             "set it to 0 or call eval()")
        if call.mask is not None:
            raise ValueError(f"context_parallel takes the shard's padding as key_mask (B, L) = ({B}, {L}), not a mask "
                             f"(got {type(call.mask).__name__} {tuple(getattr(call.mask, 'shape', ()))}): masks over "
                             "the whole sequence follow from is_causal, window and the positions")
        key_mask = call.key_mask
        positions = self.positions(L).to(q.device) if call.positions is None else call.positions
        if positions.shape != (L,):
            raise ValueError(f"context_parallel needs positions (L,) = ({L},) shared by the batch, got {tuple(positions.shape)}")
        k, v = layer.project_kv(key, value) if call.kv is None else call.kv  # (layers.attending.keys_values)
        if layer.rotary is not None:
            q, k = layer.rotary(q, positions=positions), layer.rotary(k, positions=positions)
        return self.attention(q, k, v, positions=positions, is_causal=call.is_causal, window=call.window,
                              scale=options["scale"], key_mask=key_mask)


def check_context_parallel(value, name: str = "context_parallel") -> ContextParallel | None:
    """``value`` if it is None or a :class:`ContextParallel`; else a TypeError naming ``name``."""
    if value is not None and not isinstance(value, ContextParallel):
        raise TypeError(f"{name} must be an attnkit.distributed.ContextParallel or None, got {type(value).__name__}")
    return value
