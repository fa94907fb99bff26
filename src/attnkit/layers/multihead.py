"""Multi-head attention (Vaswani et al. 2017) with grouped-query (Ainslie et al. 2023) and
multi-query (Shazeer 2019) heads, self and cross attention, and a KV cache.

    MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W_O,  head_h = Attention(Q W_Q^h, K W_K^g(h), V W_V^g(h))

where query head h uses key/value head g(h) = h // (H / Hkv).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..functional import attention
from ..functional.attention import BACKEND_NAMES, AttentionOutput
from ..functional.block_mask import BlockMask
from ..functional.checks import check_rank
from ..functional.context_parallel import check_context_parallel
from ..functional.heads import merge_heads, split_heads
from ..functional.masks import causal_positions
from ..functional.partial import merge_partial
from .cache import FixedKVCache, KVCache, SinkCache
from .positional import RotaryEmbedding

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(nn.Module):
    """Multi-head attention over (B, L, D) inputs, batch first.

    Args:
        d_model: D, the model dim (queries' feature size and the output size).
        num_heads: H query heads; D must be divisible by H (head dim E = D / H).
        num_kv_heads: Hkv key/value heads, dividing H (default H; 1 is multi-query attention).
        kdim, vdim: feature sizes of keys and values for cross attention (default D).
        bias: bias in all four projections.
        dropout: dropout on the attention weights in training mode.
        backend: attention backend, see :func:`attnkit.attention`.
        rotary: a :class:`RotaryEmbedding` applied to queries and keys after projection (Llama).
        head_dim: E when it is not D / H (then D need not be divisible by H).
        out_bias: bias in ``out_proj`` (default: ``bias``); Qwen2 has q/k/v biases only.
        scale: multiplies q k^T (default 1 / sqrt(E)).

    Parameters: ``q_proj`` (D -> H E), ``k_proj`` (kdim -> Hkv E), ``v_proj`` (vdim -> Hkv E),
    ``out_proj`` (H E -> D).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        kdim: int | None = None,
        vdim: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        backend: str = "auto",
        rotary: RotaryEmbedding | None = None,
        *,
        head_dim: int | None = None,
        out_bias: bool | None = None,
        scale: float | None = None,
    ):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if head_dim is not None and (isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1):
            raise ValueError(f"head_dim must be a positive int or None, got {head_dim!r}")
        if d_model < 1 or num_heads < 1 or (head_dim is None and d_model % num_heads):
            raise ValueError(f"d_model must be divisible by num_heads, got d_model={d_model}, num_heads={num_heads}")
        if num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(
                f"num_heads must be divisible by num_kv_heads, got num_heads={num_heads}, num_kv_heads={num_kv_heads}"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if backend not in BACKEND_NAMES:
            raise ValueError(f"backend must be one of {BACKEND_NAMES}, got {backend!r}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = d_model // num_heads if head_dim is None else head_dim
        self.scale = scale
        self.kdim = d_model if kdim is None else kdim
        self.vdim = d_model if vdim is None else vdim
        self.dropout = dropout
        self.backend = backend
        if rotary is not None and rotary.head_dim != self.head_dim:
            raise ValueError(f"rotary.head_dim={rotary.head_dim} does not match head_dim={self.head_dim}")
        self.rotary = rotary
        kv_width = num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(self.kdim, kv_width, bias=bias)
        self.v_proj = nn.Linear(self.vdim, kv_width, bias=bias)
        self.out_proj = nn.Linear(num_heads * self.head_dim, d_model, bias=bias if out_bias is None else out_bias)

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        check_rank("query", query, 3, "(B, L, D)")
        check_rank("key", key, 3, "(B, S, kdim)")
        check_rank("value", value, 3, "(B, S, vdim)")
        for name, x, width in (("query", query, self.d_model), ("key", key, self.kdim), ("value", value, self.vdim)):
            if x.shape[-1] != width:
                raise ValueError(f"{name} must have last dim {width}, got shape {tuple(x.shape)}")
        if not query.shape[0] == key.shape[0] == value.shape[0]:
            raise ValueError(
                f"batch sizes differ: query {query.shape[0]}, key {key.shape[0]}, value {value.shape[0]}"
            )
        if key.shape[1] != value.shape[1]:
            raise ValueError(f"key and value lengths differ: S={key.shape[1]} and S={value.shape[1]}")

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        mask: Tensor | BlockMask | None = None,
        is_causal: bool = False,
        window: int | None = None,
        bias: Tensor | None = None,
        need_weights: bool | Sequence[int] = False,
        cache: KVCache | FixedKVCache | None = None,
        causal_align: str | None = None,
        positions: Tensor | None = None,
        context_parallel=None,
    ) -> AttentionOutput:
        """Attend from query (B, L, D) to key (B, S, kdim) / value (B, S, vdim).

        Self attention when ``key`` and ``value`` are omitted; ``value`` defaults to ``key``.
        ``mask`` (a boolean tensor or a :class:`~attnkit.masks.BlockMask` of any sparse pattern),
        ``is_causal``, ``window``, ``bias`` and ``need_weights`` are as in :func:`attnkit.attention`; with a ``cache`` the new keys are appended and causal masks are
        aligned bottom-right unless ``causal_align`` says otherwise (S counts cached keys too).
        ``positions`` (L,) or (B, L): the rotary positions of the new tokens (default: the cache's
        position onwards), e.g. per row after left padding.
        ``context_parallel`` (:class:`attnkit.distributed.ContextParallel`): self attention over a
        sequence split across processes; ``query`` is this process's shard, ``positions`` (L,) its
        global positions (default: the layout's), ``mask`` at most a (B, 1, 1, L) key-padding mask
        of the shard; no cache, bias, weights or attention dropout.

        Returns:
            :class:`AttentionOutput` with output (B, L, D), per-head weights (B, H, L, S) or None
            (average over dim 1 for ``nn.MultiheadAttention``'s averaged weights), lse or None.
        """
        if key is None:
            if value is not None:
                raise ValueError("value was given without key; pass both for cross attention")
            key = value = query
        elif value is None:
            value = key
        self._check_inputs(query, key, value)
        if check_context_parallel(context_parallel) is not None:
            return self._attend_context_parallel(query, key, value, context_parallel, mask, is_causal, window, bias,
                                                 need_weights, cache, positions)
        q = split_heads(self.q_proj(query), self.num_heads)  # (B, H, L, E)
        if isinstance(cache, SinkCache):
            return self._attend_with_sinks(q, key, value, cache, mask, is_causal, window, bias, need_weights, positions)
        if isinstance(cache, FixedKVCache):
            return self._attend_fixed(q, key, value, cache, mask, is_causal, window, bias, need_weights, positions)
        offset = 0 if cache is None or cache.static else cache.position
        if self.rotary is not None:
            q = self.rotary(q, offset=offset, positions=positions)
        if cache is not None and cache.static and cache.keys is not None and cache.values is not None:
            k, v = cache.keys, cache.values  # cross attention: encoder keys projected once
        else:
            k = split_heads(self.k_proj(key), self.num_kv_heads)  # (B, Hkv, S, E)
            v = split_heads(self.v_proj(value), self.num_kv_heads)  # (B, Hkv, S, E)
            if self.rotary is not None:
                k = self.rotary(k, offset=offset, positions=positions)
            if cache is not None:
                k, v = cache.update(k, v)
        if causal_align is None:
            causal_align = "top-left" if cache is None else "bottom-right"
        result = attention(
            q,
            k,
            v,
            mask=mask,
            is_causal=is_causal,
            causal_align=causal_align,
            window=window,
            bias=bias,
            scale=self.scale,
            dropout_p=self.dropout if self.training else 0.0,
            backend=self.backend,
            need_weights=need_weights,
        )
        output = self.out_proj(merge_heads(result.output))  # (B, L, D)
        return AttentionOutput(output=output, weights=result.weights, lse=result.lse)

    def _attend_context_parallel(self, query, key, value, cp, mask, is_causal, window, bias, need_weights, cache,
                                 positions) -> AttentionOutput:
        B, L = query.shape[:2]
        if key is not query or value is not query:
            raise ValueError("context_parallel is for self attention: give query only")
        if cache is not None or bias is not None or need_weights:
            raise ValueError("context_parallel takes no cache, bias or need_weights")
        if self.training and self.dropout > 0:
            raise ValueError(f"context_parallel has no attention dropout (this layer's is {self.dropout}); "
                             "set it to 0 or call eval()")
        key_mask = None
        if mask is not None:
            if isinstance(mask, BlockMask) or tuple(mask.shape) != (B, 1, 1, L) or mask.dtype != torch.bool:
                raise ValueError(f"context_parallel takes a boolean key-padding mask (B, 1, 1, L) = ({B}, 1, 1, {L}) "
                                 f"of this shard, got {type(mask).__name__} {tuple(getattr(mask, 'shape', ()))}")
            key_mask = mask[:, 0, 0, :]
        if positions is None:
            positions = cp.positions(L).to(query.device)
        if positions.shape != (L,):
            raise ValueError(f"context_parallel needs positions (L,) = ({L},) shared by the batch, got {tuple(positions.shape)}")
        q = split_heads(self.q_proj(query), self.num_heads)  # (B, H, L, E)
        k = split_heads(self.k_proj(query), self.num_kv_heads)
        v = split_heads(self.v_proj(query), self.num_kv_heads)
        if self.rotary is not None:
            q, k = self.rotary(q, positions=positions), self.rotary(k, positions=positions)
        out = cp.attention(q, k, v, positions=positions, is_causal=is_causal, window=window, scale=self.scale,
                           key_mask=key_mask)
        return AttentionOutput(output=self.out_proj(merge_heads(out)), weights=None, lse=None)

    def _attend_fixed(self, q, key, value, cache: FixedKVCache, mask, is_causal, window, bias, need_weights, positions):
        """Causal self attention through a :class:`FixedKVCache`: the same shapes at every step
        (all ``capacity`` columns, the unwritten ones masked) and no read from the device."""
        if not is_causal:
            raise ValueError("a FixedKVCache is for causal self attention (decoding); pass is_causal=True")
        if isinstance(mask, BlockMask):
            raise ValueError("a FixedKVCache takes a boolean mask (B, 1, 1, capacity), not a BlockMask")
        columns = cache.columns(q.shape[2], q.device)  # (L,)
        rotary_positions = columns if positions is None else positions
        k = split_heads(self.k_proj(key), self.num_kv_heads)
        v = split_heads(self.v_proj(value), self.num_kv_heads)
        if self.rotary is not None:
            q = self.rotary(q, positions=rotary_positions)
            k = self.rotary(k, positions=rotary_positions)
        k, v = cache.write(k, v, columns)  # (B, Hkv, capacity, E)
        allowed = cache.allowed(columns, window)  # (L, capacity)
        result = attention(q, k, v, mask=allowed if mask is None else mask & allowed, bias=bias, scale=self.scale,
                           dropout_p=self.dropout if self.training else 0.0, backend=self.backend,
                           need_weights=need_weights)
        return AttentionOutput(output=self.out_proj(merge_heads(result.output)), weights=result.weights, lse=result.lse)

    def _attend_with_sinks(self, q, key, value, cache: SinkCache, mask, is_causal, window, bias, need_weights, positions):
        """Self attention through a :class:`SinkCache`: keys cached unrotated, rotated at their
        cache index each step; queries past the cache's limit meet the sinks at the limit's
        position (a second attention call over the sinks, merged by log-sum-exp)."""
        if not is_causal or window is not None or mask is not None or bias is not None or positions is not None:
            raise ValueError("a SinkCache is for causal self attention without window, mask, bias or positions: "
                             "it supplies the sinks + window pattern itself")
        if need_weights:
            raise ValueError("need_weights is not available with a SinkCache (the sinks are attended in a second call)")
        k = split_heads(self.k_proj(key), self.num_kv_heads)
        v = split_heads(self.v_proj(value), self.num_kv_heads)
        keys, values = cache.update(k, v)  # unrotated (B, Hkv, S, E)
        S, L = keys.shape[2], q.shape[2]
        device = q.device
        index = torch.arange(S - L, S, device=device)  # the queries' cache indices
        j = torch.arange(S, device=device)
        sinks = min(cache.sinks, S)
        late = index > cache.limit  # rows whose sinks sit at the limit's position, not their own
        allowed = causal_positions(index, j, cache.recent)
        allowed |= (j[None, :] < sinks) & causal_positions(index, j) & ~late[:, None]
        if self.rotary is not None:
            q_main = self.rotary(q, positions=index)
            keys = self.rotary(keys, positions=j)
        else:
            q_main = q
        backend = "reference" if self.backend in ("sdpa", "auto") else self.backend  # both need lse
        dropout = self.dropout if self.training else 0.0
        main = attention(q_main, keys, values, mask=allowed, scale=self.scale, dropout_p=dropout, backend=backend)
        output = main.output
        if bool(late.any()) and sinks:
            q_sink = self.rotary(q, positions=index.clamp(max=cache.limit)) if self.rotary is not None else q
            sink_mask = late[:, None].expand(L, sinks)
            part = attention(q_sink, keys[:, :, :sinks], values[:, :, :sinks], mask=sink_mask, scale=self.scale,
                             dropout_p=dropout, backend=backend)
            assert main.lse is not None and part.lse is not None  # the backends used here return it
            merged, _ = merge_partial(main.output.to(main.lse.dtype), main.lse, part.output, part.lse)
            output = merged.to(q.dtype)
        return AttentionOutput(output=self.out_proj(merge_heads(output)))
