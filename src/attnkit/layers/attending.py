"""How a layer attends: one call, whatever the strategy.

:class:`~attnkit.layers.MultiHeadAttention` projects the queries and hands them, with its key and
value inputs and the call's options (:class:`AttentionCall`), to an attention strategy, the one
object that decides where keys come from and which positions they sit at:

- :data:`PLAIN`: no cache; keys and values from this call's inputs;
- the KV caches of :mod:`attnkit.layers.cache`: growing or rolling (:class:`KVCache`), filled once
  for cross attention (``KVCache(static=True)``), fixed-size (:class:`FixedKVCache`), sinks plus a
  window (:class:`SinkCache`);
- context parallelism (:class:`attnkit.distributed.ContextParallel`): the sequence split across
  processes.

Every strategy answers :meth:`Attending.attend` and returns the heads' :class:`AttentionOutput`;
the layer has one path and never asks which strategy it holds (transformers' models make one call,
``past_key_values.update(...)``, whatever their cache; here the strategy also owns the attention
call, since a sinks cache needs two and context parallelism a distributed one). A new kind of
cache is a new object answering the same call.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import NamedTuple, Protocol

from torch import Tensor

from ..functional import kept
from ..functional.attention import AttentionOutput, attention_trusted
from ..functional.block_mask import BlockMask
from .calls import called

__all__ = ["AttentionCall", "Attending", "Cache", "PLAIN", "keys_values", "rotated", "strategy", "make_call"]


class AttentionCall(NamedTuple):
    """The options of one layer call, as :meth:`MultiHeadAttention.forward` received them:
    ``mask``, ``is_causal``, ``window``, ``bias``, ``need_weights`` as in :func:`attnkit.attention`;
    ``causal_align`` None for the strategy's default (top-left without a cache, bottom-right with
    one); ``positions`` (L,) or (B, L) rotary positions of the new tokens, None for the strategy's;
    ``self_attention`` whether keys and values are the queries' own inputs; ``key_mask`` (B, S)
    True at real keys (:meth:`mask_for` joins it to ``mask``); ``kv`` the new keys and values (B, Hkv, S, E)
    where the layer projected them with its queries (one packed projection), else None
    (:func:`keys_values`); ``qk`` the queries and those keys side by side, (B, H + Hkv, L, E) with
    q = qk[:, :H] and kv[0] = qk[:, H:], where the layer projected them so and rotates them, else None
    (:func:`rotated`: one rotation for both)."""

    mask: Tensor | BlockMask | None = None
    is_causal: bool = False
    window: int | None = None
    bias: Tensor | None = None
    need_weights: bool | Sequence[int] = False
    causal_align: str | None = None
    positions: Tensor | None = None
    self_attention: bool = True
    key_mask: Tensor | None = None
    kv: tuple[Tensor, Tensor] | None = None
    qk: Tensor | None = None

    def mask_for(self, B: int, S: int) -> Tensor | BlockMask | None:
        """``mask`` and ``key_mask`` (B, S) as one mask for S keys: (B, 1, 1, S) where only the key mask
        is given. A key mask of another shape is refused by name; so is one beside a BlockMask (whose
        padding belongs in its mask_mod, :func:`attnkit.masks.real_tokens_mod`)."""
        if self.key_mask is None:
            return self.mask
        key_mask = self.key_mask
        if not isinstance(key_mask, Tensor) or key_mask.shape != (B, S) or key_mask.is_floating_point():
            got = (key_mask.dtype, tuple(key_mask.shape)) if isinstance(key_mask, Tensor) else type(key_mask).__name__
            raise ValueError(f"key_mask must be boolean (or 0/1) of shape (B, S) = ({B}, {S}), True at real keys, "
                             f"got {got}")
        keys = _as_keys(key_mask, B, S)  # (B, 1, 1, S)
        if self.mask is None:
            return keys
        if isinstance(self.mask, BlockMask):
            raise ValueError("key_mask and a BlockMask mask: put the padding in the block mask's mask_mod "
                             "(attnkit.masks.real_tokens_mod)")
        return self.mask & keys


make_call = partial(tuple.__new__, AttentionCall)
"""``make_call((mask, is_causal, window, bias, need_weights, causal_align, positions, self_attention, key_mask, kv, qk))``:
an :class:`AttentionCall` built by tuple's own constructor, once per layer call (a NamedTuple's generated
``__new__`` costs a quarter of a microsecond more). Every field in order, none left out."""


def keys_values(layer, key: Tensor, value: Tensor, call: AttentionCall) -> tuple[Tensor, Tensor]:
    """A strategy's new keys and values (B, Hkv, S, E): those the layer projected with its queries
    (``call.kv``), else ``layer.project_kv(key, value)``."""
    return layer.project_kv(key, value) if call.kv is None else call.kv


def rotated(rotary, q: Tensor, k: Tensor, qk: Tensor | None, offset: int = 0,
            positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """q and k rotated by a layer's ``rotary`` embedding at the same positions (``positions``, else ``offset``
    on): in one rotation where the layer projected them side by side (``qk``, :attr:`AttentionCall.qk`; a
    decoding step's rotations are four small ops and host time each), else one each. The same numbers either
    way (the rotation is elementwise)."""
    rotate = called(rotary)
    if qk is not None:
        return rotate(qk, offset=offset, positions=positions).split_with_sizes((q.shape[1], k.shape[1]), 1)
    return rotate(q, offset=offset, positions=positions), rotate(k, offset=offset, positions=positions)


def _as_keys(key_mask: Tensor, B: int, S: int) -> Tensor:
    """``key_mask`` (B, S) as a boolean (B, 1, 1, S) mask, built once per model call (:mod:`.kept`): every
    layer of a model gets the same key mask, and the same mask back (whose own checks are then kept beside
    it); a mask rewritten between calls, by any means, is read afresh."""
    return kept.get(key_mask, "keys", lambda: key_mask.bool().reshape(B, 1, 1, S))  # (one view op: indexing with None is slower)


class Attending(Protocol):
    """An attention strategy: a cache, context parallelism, or :data:`PLAIN`.

    ``layer`` offers ``project_kv(key, value) -> (k, v)`` (B, Hkv, S, E), ``rotary`` (or None) and
    ``attention_options()`` (scale, dropout_p, backend); ``q`` is (B, H, L, E), projected, not
    rotated; ``key`` / ``value`` are the layer's inputs (B, S, kdim|vdim). Returns the heads'
    output (B, H, L, Ev) with weights and lse where asked for and available."""

    def attend(self, layer, q: Tensor, key: Tensor, value: Tensor, call: AttentionCall) -> AttentionOutput: ...


class Cache(Attending, Protocol):
    """What a model asks of a KV cache besides :meth:`~Attending.attend` (:mod:`attnkit.layers.cache`):
    ``attended_length(new)`` (the S of an attention mask for ``new`` more tokens),
    ``new_positions(new, device)`` (their positions when the cache dictates them, on the device, as
    a fixed-size cache does; else None) and, only where that is None, ``position`` (positions
    appended so far: the new tokens continue from it)."""

    position: int

    def attended_length(self, new: int) -> int: ...

    def new_positions(self, new: int, device) -> Tensor | None: ...


class _Plain:
    """No cache: this call's keys and values, rotated at ``positions`` (default 0 .. S - 1)."""

    def attend(self, layer, q: Tensor, key: Tensor, value: Tensor, call: AttentionCall) -> AttentionOutput:
        k, v = keys_values(layer, key, value, call)
        rotary = layer.rotary
        if rotary is not None:
            q, k = rotated(rotary, q, k, call.qk, 0, call.positions)
        mask = call.mask if call.key_mask is None else call.mask_for(k.shape[0], k.shape[2])
        return attention_trusted(q, k, v, mask, call.is_causal, call.causal_align or "top-left", call.window, call.bias,
                                 layer.scale, layer.dropout if layer.training else 0.0, layer.backend, call.need_weights)

    def __repr__(self) -> str:
        return "PLAIN"


PLAIN = _Plain()
"""The strategy of a call without a cache."""


def strategy(cache, context_parallel) -> Attending:
    """The one strategy a call runs: its ``cache``, its ``context_parallel``, or :data:`PLAIN`; each
    must answer ``attend`` (a TypeError names the argument otherwise)."""
    if cache is None and context_parallel is None:
        return PLAIN
    if cache is not None and context_parallel is not None:
        raise ValueError("context_parallel takes no cache: the sequence is split across processes, not decoded")
    for name, chosen in (("cache", cache), ("context_parallel", context_parallel)):
        if chosen is not None:
            if not callable(getattr(chosen, "attend", None)):
                raise TypeError(f"{name} must be an attnkit cache (KVCache, FixedKVCache, SinkCache) or an attention "
                                f"strategy with attend(), such as attnkit.distributed.ContextParallel; got "
                                f"{type(chosen).__name__}")
            return chosen
    return PLAIN
