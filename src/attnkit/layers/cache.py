"""Key/value caches for incremental (autoregressive) decoding, each an attention strategy.

Every cache answers :meth:`~attnkit.layers.attending.Attending.attend`, the one call
:class:`~attnkit.layers.MultiHeadAttention` makes whatever it was handed: the cache rotates the new
queries and keys at the positions it knows, stores the keys and values, and attends. For a model
they also answer ``attended_length(new)`` (the S of an attention mask for the next ``new`` tokens)
and ``new_positions(new, device)`` (the positions of the next ``new`` tokens when the cache
dictates them, else None: the count of positions so far, ``position``, onwards).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..functional.attention import AttentionOutput, attention_trusted, lse_backend
from ..functional.block_mask import BlockMask
from ..functional.checks import check_int, check_rank, check_same
from ..functional.masks import causal_positions
from ..functional.partial import merge_partial
from .attending import AttentionCall, keys_values, rotated

__all__ = ["KVCache", "SinkCache", "FixedKVCache"]


class KVCache:
    """Keys and values of the positions decoded so far, for one attention layer.

    :meth:`update` appends new keys (B, Hkv, S_new, E) and values (B, Hkv, S_new, Ev) and returns
    all of them, (B, Hkv, S, E) and (B, Hkv, S, Ev). Storage grows by doubling, so appending one
    token is amortised O(1) copies. Queries of a step attend with bottom-right causal alignment:
    the last new query sees every cached key.

    ``window=W`` makes it a rolling cache for sliding-window attention (Mistral): after each
    update only the last W positions are kept, so memory stays constant however long the output.
    ``position`` counts every position ever appended (the offset for rotary embeddings);
    ``length`` counts those held. The cache's window is the attention window: a call with
    ``window=None`` attends the last W positions, a smaller window its own, and a larger one, which
    would need keys the cache has dropped, is refused.

    A ``static=True`` cache is for cross attention: the first update stores the projected
    encoder keys and values, and every later step reuses them without recomputing. Its queries
    are rotated (with a rotary layer) at the positions of the steps so far (``queries`` counts
    them), its keys at 0 .. S - 1 once; a step's batch must be the batch the cache was filled for.

    Example::

        cache = KVCache()
        for token in ...:
            out = mha(x_step, is_causal=True, cache=cache)
    """

    def __init__(self, *, static: bool = False, window: int | None = None) -> None:
        if window is not None and (static or window < 1):
            raise ValueError(f"window must be a positive int on a non-static cache, got window={window!r}, static={static}")
        self.static = static
        self.window: int | None = window
        self._keys: Tensor | None = None
        self._values: Tensor | None = None
        self._start = 0  # first held position in storage
        self._end = 0  # one past the last held position in storage
        self.position = 0
        self.queries = 0  # query positions attended so far (a static cache's queries continue from it)

    @property
    def length(self) -> int:
        """Positions held (and attended to by the next step, besides its own)."""
        return self._end - self._start

    def __len__(self) -> int:
        return self.length

    @property
    def keys(self) -> Tensor | None:
        """(B, Hkv, S, E) cached keys, or None before the first update."""
        return None if self._keys is None else self._keys[:, :, self._start : self._end]

    @property
    def values(self) -> Tensor | None:
        """(B, Hkv, S, Ev) cached values, or None before the first update."""
        return None if self._values is None else self._values[:, :, self._start : self._end]

    def reset(self) -> None:
        self._keys = self._values = None
        self._start = self._end = self.position = self.queries = 0

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (B_new,) in that order, e.g. the surviving beams of a beam search."""
        if self._keys is not None and self._values is not None:
            self._keys = self._keys.index_select(0, index)
            self._values = self._values.index_select(0, index)

    def attend(self, layer, q: Tensor, key: Tensor, value: Tensor, call: AttentionCall) -> AttentionOutput:
        """The attention strategy's call: the new keys rotated from ``position`` on (unless
        ``call.positions`` says), appended, and attended with bottom-right causal alignment (unless
        ``call.causal_align`` says). A static cache projects its keys at the first call only, and
        rotates each step's queries after those of the steps before (``queries``)."""
        window = self._window_for(call.window)
        if self.static:
            output = self._attend_static(layer, q, key, value, call)
        else:
            k, v = keys_values(layer, key, value, call)  # (B, Hkv, S, E)
            rotary = layer.rotary
            if rotary is not None:
                q, k = rotated(rotary, q, k, call.qk, self.position, call.positions)
            k, v = self._append(k, v)  # the layer built them: update()'s checks would only repeat its own
            options = layer.attention_options()  # by position: a keyword costs a quarter of a microsecond
            output = attention_trusted(q, k, v, call.mask_for(k.shape[0], k.shape[2]), call.is_causal,
                                       call.causal_align or "bottom-right", window, call.bias, options["scale"],
                                       options["dropout_p"], options["backend"], call.need_weights)
        self.queries += q.shape[2]
        return output

    def _attend_static(self, layer, q: Tensor, key: Tensor, value: Tensor, call: AttentionCall) -> AttentionOutput:
        """Cross attention: the encoder's keys and values projected (and rotated at 0 .. S - 1) at the first
        call, reused after; the queries rotated from ``queries`` on (unless ``call.positions`` says)."""
        if layer.rotary is not None:
            q = layer.rotary(q, offset=self.queries, positions=call.positions)
        if self.keys is not None and self.values is not None:
            k, v = self.keys, self.values
            if q.shape[0] != k.shape[0]:
                raise ValueError(f"this static (cross-attention) cache was filled for batch {k.shape[0]}, got a query "
                                 f"of batch {q.shape[0]}: reset() it, or reorder() it to the new batch first")
        else:
            k, v = keys_values(layer, key, value, call)  # (B, Hkv, S, E)
            if layer.rotary is not None:
                k = layer.rotary(k)
            k, v = self._append(k, v)
        return attention_trusted(q, k, v, mask=call.mask_for(k.shape[0], k.shape[2]), is_causal=call.is_causal,
                                 causal_align=call.causal_align or "bottom-right", window=call.window, bias=call.bias,
                                 need_weights=call.need_weights, **layer.attention_options())

    def _window_for(self, window: int | None) -> int | None:
        """The call's attention window against a rolling cache's: None takes the cache's; a larger one is
        refused (the keys it needs are gone)."""
        if self.window is None or self.static:
            return window
        if window is None:
            return self.window
        if window > self.window:
            raise ValueError(f"window={window} is larger than this rolling KVCache's window={self.window}: the keys it "
                             f"would attend beyond the last {self.window} positions are not kept. Use a "
                             f"KVCache(window={window}) (or larger), or window <= {self.window}")
        return window

    def attended_length(self, new: int) -> int:
        """S for ``new`` more tokens: the held positions and the new ones."""
        return self.length + new

    def new_positions(self, new: int, device) -> Tensor | None:
        """None: the new tokens continue from ``position``."""
        return None

    def update(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Append (B, Hkv, S_new, E) keys and (B, Hkv, S_new, Ev) values; return all held ones
        (for a rolling cache: the last ``window`` before this step, plus the new ones)."""
        check_rank("keys", keys, 4, "(B, Hkv, S_new, E)")
        check_rank("values", values, 4, "(B, Hkv, S_new, Ev)")
        check_same("keys", keys, values=values)
        if keys.shape[:3] != values.shape[:3]:
            raise ValueError(
                f"keys and values must agree in (B, Hkv, S_new), got {tuple(keys.shape)} and {tuple(values.shape)}"
            )
        return self._append(keys, values)

    def _append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`update` without the checks of ``keys`` and ``values`` themselves, for a pair a layer
        built; what the cache holds from earlier calls is still compared with them."""
        if self.static and self.length:
            raise ValueError("this static (cross-attention) cache is already filled; reset() it first")
        held_k, held_v = self._keys, self._values
        if held_k is not None and held_v is not None:
            hk, hv, nk, nv = held_k.shape, held_v.shape, keys.shape, values.shape
            if not (hk[0] == nk[0] and hk[1] == nk[1] and hk[3] == nk[3] and hv[0] == nv[0] and hv[1] == nv[1]
                    and hv[3] == nv[3] and keys.dtype is held_k.dtype and (keys.is_cpu and held_k.is_cpu
                                                                            or keys.device == held_k.device)):
                self._check_matches(keys, values)  # the common step settled above; here each mismatch is named
        new = keys.shape[2]
        if self._keys is None or self._values is None or self._end + new > self._keys.shape[2]:
            self._keys, self._values = self._grown(keys, values, max(self.length + new, 2 * self.length, 16))
        self._keys[:, :, self._end : self._end + new] = keys
        self._values[:, :, self._end : self._end + new] = values
        self._end += new
        self.position += new
        held_keys = self._keys[:, :, self._start : self._end]
        held_values = self._values[:, :, self._start : self._end]
        if self.window is not None:
            self._start = max(self._start, self._end - self.window)
        return held_keys, held_values

    def _check_matches(self, keys: Tensor, values: Tensor) -> None:
        """Raise unless new keys and values match what the cache holds in (B, Hkv, E) / (B, Hkv, Ev), dtype
        and device."""
        assert self._keys is not None and self._values is not None
        expected_k = (self._keys.shape[0], self._keys.shape[1], self._keys.shape[3])
        expected_v = (self._values.shape[0], self._values.shape[1], self._values.shape[3])
        got_k = (keys.shape[0], keys.shape[1], keys.shape[3])
        got_v = (values.shape[0], values.shape[1], values.shape[3])
        if got_k != expected_k or got_v != expected_v:
            raise ValueError(
                f"cache holds (B, Hkv, E)={expected_k} keys and (B, Hkv, Ev)={expected_v} values, "
                f"got {got_k} and {got_v}"
            )
        check_same("cached keys", self._keys, keys=keys)

    def _grown(self, keys: Tensor, values: Tensor, capacity: int) -> tuple[Tensor, Tensor]:
        """New storage of ``capacity`` positions holding the current ones at its front."""
        B, Hkv, _, E = keys.shape
        new_keys = keys.new_empty(B, Hkv, capacity, E)
        new_values = values.new_empty(B, Hkv, capacity, values.shape[3])
        held = self.length
        if self._keys is not None and self._values is not None:
            new_keys[:, :, :held] = self._keys[:, :, self._start : self._end]
            new_values[:, :, :held] = self._values[:, :, self._start : self._end]
        self._start, self._end = 0, held
        return new_keys, new_values


class SinkCache(KVCache):
    """StreamingLLM's cache (Xiao et al. 2023): the first ``sinks`` positions ("attention sinks")
    kept for ever, plus a rolling window of the most recent ones, so memory stays constant however
    long the text. Each query attends the sinks and the ``window`` most recent keys (itself included).

    Keys are cached *before* rotation: :class:`~attnkit.MultiHeadAttention` rotates the held keys
    at their index in the cache (0 .. S-1) on every step and each query at its own index, so that
    distances to recent keys are the true ones, and a query that has seen more than
    ``sinks + window - 1`` keys sits at position ``sinks + window - 1`` for the sinks, exactly as
    StreamingLLM decodes token by token (its queries rotated at their cache position). Steps of
    several tokens (prompts, chunked scoring) give each query the keys and positions it would
    have had one token at a time.

    After an update it holds at most ``sinks + window - 1`` positions.
    """

    def __init__(self, sinks: int, window: int) -> None:
        check_int("sinks", sinks, 0)
        check_int("window", window, 1)
        super().__init__()
        self.sinks = sinks
        self.window = window  # read by MultiHeadAttention, not the parent's rolling logic
        self._window = window
        self._held_keys: Tensor | None = None
        self._held_values: Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self._held_keys is None else self._held_keys.shape[2]

    @property
    def keys(self) -> Tensor | None:
        return self._held_keys

    @property
    def values(self) -> Tensor | None:
        return self._held_values

    @property
    def recent(self) -> int:
        """How many of the most recent keys each query attends (itself included): the window."""
        return self._window

    @property
    def limit(self) -> int:
        """The cache index at and beyond which a query's sink positions stop growing."""
        return self.sinks + self._window - 1

    def reset(self) -> None:
        self._held_keys = self._held_values = None
        self.position = 0

    def reorder(self, index: Tensor) -> None:
        if self._held_keys is not None and self._held_values is not None:
            self._held_keys = self._held_keys.index_select(0, index)
            self._held_values = self._held_values.index_select(0, index)

    def attend(self, layer, q: Tensor, key: Tensor, value: Tensor, call: AttentionCall) -> AttentionOutput:
        """Causal self attention: keys cached unrotated, rotated at their cache index each step;
        queries past the cache's limit meet the sinks at the limit's position (a second attention
        call over the sinks, merged by log-sum-exp). Both calls run a backend that returns the lse in
        linear memory (tiled; flex on CUDA), never an L x S matrix."""
        if not call.self_attention:
            raise ValueError("key: a SinkCache is for causal self attention, got a key and value of another sequence "
                             "(cross attention): use KVCache(static=True) for cross attention")
        if (not call.is_causal or call.window is not None or call.mask is not None or call.bias is not None
                or call.positions is not None or call.key_mask is not None):
            raise ValueError("a SinkCache is for causal self attention without window, mask, key_mask, bias or positions: "
                             "it supplies the sinks + window pattern itself")
        if call.need_weights:
            raise ValueError("need_weights is not available with a SinkCache (the sinks are attended in a second call)")
        k, v = keys_values(layer, key, value, call)
        keys, values = self.update(k, v)  # unrotated (B, Hkv, S, E)
        S, L = keys.shape[2], q.shape[2]
        device = q.device
        index = torch.arange(S - L, S, device=device)  # the queries' cache indices
        j = torch.arange(S, device=device)
        sinks = min(self.sinks, S)
        late = index > self.limit  # rows whose sinks sit at the limit's position, not their own
        allowed = causal_positions(index, j, self.recent)
        allowed |= (j[None, :] < sinks) & causal_positions(index, j) & ~late[:, None]
        rotary = layer.rotary
        q_main = q if rotary is None else rotary(q, positions=index)
        keys = keys if rotary is None else rotary(keys, positions=j)
        options = layer.attention_options()
        if options["backend"] in ("sdpa", "auto"):  # both calls need the lse
            options["backend"] = lse_backend(q, options["dropout_p"])
        main = attention_trusted(q_main, keys, values, mask=allowed, **options)
        output = main.output
        if bool(late.any()) and sinks:
            q_sink = q if rotary is None else rotary(q, positions=index.clamp(max=self.limit))
            part = attention_trusted(q_sink, keys[:, :, :sinks], values[:, :, :sinks], mask=late[:, None].expand(L, sinks),
                             **options)
            assert main.lse is not None and part.lse is not None  # the backends used here return it
            merged, _ = merge_partial(main.output.to(main.lse.dtype), main.lse, part.output, part.lse)
            output = merged.to(q.dtype)
        return AttentionOutput(output=output)

    def update(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Append unrotated (B, Hkv, S_new, E) keys and values; return every held one (sinks,
        the last window - 1 before this step, the new ones), then evict down to the sinks and
        the last window - 1."""
        check_rank("keys", keys, 4, "(B, Hkv, S_new, E)")
        check_rank("values", values, 4, "(B, Hkv, S_new, Ev)")
        check_same("keys", keys, values=values)
        if self._held_keys is not None and self._held_values is not None:
            if keys.shape[:2] != self._held_keys.shape[:2] or keys.shape[3] != self._held_keys.shape[3]:
                raise ValueError(f"cache holds keys of shape {tuple(self._held_keys.shape)}, got new keys {tuple(keys.shape)}")
            keys = torch.cat([self._held_keys, keys], dim=2)
            values = torch.cat([self._held_values, values], dim=2)
        self.position += keys.shape[2] - self.length
        held = self.limit
        if keys.shape[2] > held:
            recent = self._window - 1
            keep = lambda x: torch.cat([x[:, :, : self.sinks], x[:, :, x.shape[2] - recent :]], dim=2)  # noqa: E731
            self._held_keys, self._held_values = keep(keys), keep(values)
        else:
            self._held_keys, self._held_values = keys, values
        return keys, values


class FixedKVCache:
    """A cache of fixed size, for decoding with the same shapes at every step (transformers'
    ``StaticCache``): storage for ``capacity`` positions is allocated at the first write, each
    step's keys and values are written at columns held in a device tensor, and every step attends
    all ``capacity`` columns through a mask that hides the ones not yet written. No step reads the
    device or changes a shape, so one decode step can be compiled once (``torch.compile``) or
    captured in a CUDA graph (``generate(..., compile_step=True)``).

    ``next``: (1,) int64 on the storage's device, the column of the next position (the count of
    positions written). A sequence longer than ``capacity`` is an error the cache cannot see
    without reading the device: :func:`attnkit.decoding.generate` sizes it from the prompt and
    ``max_new_tokens``. Not to be confused with ``KVCache(static=True)``, the cross-attention cache
    filled once.
    """

    def __init__(self, capacity: int) -> None:
        check_int("capacity", capacity, 1)
        self.capacity = capacity
        self.next: Tensor | None = None
        self._keys: Tensor | None = None
        self._values: Tensor | None = None

    def attend(self, layer, q: Tensor, key: Tensor, value: Tensor, call: AttentionCall) -> AttentionOutput:
        """Causal self attention with the same shapes at every step (all ``capacity`` columns, the
        unwritten ones masked) and no read from the device."""
        if not call.self_attention:
            raise ValueError("key: a FixedKVCache is for causal self attention, got a key and value of another "
                             "sequence (cross attention): use KVCache(static=True) for cross attention")
        if not call.is_causal:
            raise ValueError("a FixedKVCache is for causal self attention (decoding); pass is_causal=True")
        if isinstance(call.mask, BlockMask):
            raise ValueError("a FixedKVCache takes a boolean mask (B, 1, 1, capacity), not a BlockMask")
        columns = self.columns(q.shape[2], q.device)  # (L,)
        positions = columns if call.positions is None else call.positions
        k, v = keys_values(layer, key, value, call)
        rotary = layer.rotary
        if rotary is not None:
            q, k = rotated(rotary, q, k, call.qk, 0, positions)
        k, v = self.write(k, v, columns)  # (B, Hkv, capacity, E)
        allowed = self.allowed(columns, call.window)  # (L, capacity)
        mask = call.mask_for(k.shape[0], self.capacity)
        assert not isinstance(mask, BlockMask)  # refused above
        return attention_trusted(q, k, v, mask=allowed if mask is None else mask & allowed, bias=call.bias,
                         need_weights=call.need_weights, **layer.attention_options())

    def attended_length(self, new: int) -> int:
        """S for any step: the capacity (every column is attended, the unwritten ones masked)."""
        return self.capacity

    def new_positions(self, new: int, device) -> Tensor:
        """The columns of the next ``new`` positions, on the device: no read."""
        return self.columns(new, device)

    def columns(self, new: int, device: torch.device) -> Tensor:
        """(new,) int64: the columns (and default positions) of the next ``new`` positions."""
        if self.next is None:
            self.next = torch.zeros(1, dtype=torch.long, device=device)
        return self.next + torch.arange(new, device=device)

    def write(self, keys: Tensor, values: Tensor, columns: Tensor) -> tuple[Tensor, Tensor]:
        """Write (B, Hkv, L, E) keys and (B, Hkv, L, Ev) values at ``columns`` (L,) (from
        :meth:`columns`), advance ``next`` by L, and return the whole storage (B, Hkv, capacity, .)."""
        check_rank("keys", keys, 4, "(B, Hkv, L, E)")
        check_rank("values", values, 4, "(B, Hkv, L, Ev)")
        check_same("keys", keys, values=values)
        if keys.shape[2] > self.capacity:
            raise ValueError(f"{keys.shape[2]} new positions exceed this FixedKVCache's capacity={self.capacity}")
        if self._keys is None or self._values is None:
            B, Hkv, _, E = keys.shape
            self._keys = keys.new_zeros(B, Hkv, self.capacity, E)
            self._values = values.new_zeros(B, Hkv, self.capacity, values.shape[3])
        elif keys.shape[:2] != self._keys.shape[:2] or keys.shape[3] != self._keys.shape[3] or \
                values.shape[3] != self._values.shape[3]:
            raise ValueError(f"cache holds keys {tuple(self._keys.shape)} and values {tuple(self._values.shape)}, "
                             f"got new keys {tuple(keys.shape)} and values {tuple(values.shape)}")
        self._keys.index_copy_(2, columns, keys)
        self._values.index_copy_(2, columns, values)
        assert self.next is not None, "columns() comes first"
        self.next.add_(keys.shape[2])
        return self._keys, self._values

    def allowed(self, columns: Tensor, window: int | None = None) -> Tensor:
        """(L, capacity) boolean: query at column c sees keys c - window < j <= c (j <= c without
        a window): causal, and never a column not yet written."""
        return causal_positions(columns, torch.arange(self.capacity, device=columns.device), window)

    def tensors(self) -> list[Tensor]:
        """The storage and ``next``: the tensors a compiled step updates in place."""
        return [t for t in (self._keys, self._values, self.next) if t is not None]

    def use(self, keys: Tensor, values: Tensor, next_column: Tensor) -> None:
        """Read and write ``keys``, ``values`` and ``next_column`` (the tensors :meth:`tensors` gave, or a module's
        buffers holding them, which torch.export swaps for its own while tracing) from now on."""
        self._keys, self._values, self.next = keys, values, next_column

    def reset(self) -> None:
        """Forget every position: back to column 0, the storage zeroed in place (as a new cache's;
        its address is kept, which a compiled step or a captured CUDA graph relies on)."""
        for tensor in self.tensors():
            tensor.zero_()

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (B_new,) in that order (beam search)."""
        if self._keys is not None and self._values is not None:
            self._keys = self._keys.index_select(0, index)
            self._values = self._values.index_select(0, index)
