"""Decoder-only language models: GPT-2 (Radford et al. 2019) and Llama (Touvron et al. 2023)
styles, optionally with Mistral's sliding-window attention (Jiang et al. 2023).

    x_0 = E_token[ids] (+ E_position),  x_l = x + MLP(Norm(x)) after x = x + Attn(Norm(x)),
    logits = Norm(x_L) W_out   (W_out tied to E_token when ``tie_embeddings``)

GPT-2: learned positions, LayerNorm, GELU (tanh) MLP, biases. Llama: RoPE on queries and keys,
RMSNorm, SwiGLU MLP, grouped-query attention, no biases. Every attention is the core's
:class:`~attnkit.MultiHeadAttention` with ``is_causal=True`` (and ``window`` for Mistral).

Shapes: B batch, L new tokens, S all tokens attended (cached + new), D model dim, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..distributed import check_context_parallel
from ..functional import kept
from ..functional.block_mask import BlockMask
from ..functional.block_patterns import document_block_mask
from ..functional.checks import check_int, check_rank
from ..layers import FixedKVCache, KVCache, LearnedPositionalEmbedding, MultiHeadAttention, RotaryEmbedding, SinkCache
from ..layers.attending import Attending, Cache
from ..layers.calls import called, project_by_name
from .blocks import Dropout, FeedForward, GatedFeedForward, layer_key_masks, make_norm, normalised
from .config import DecoderConfig
from .outputs import LMOutput

__all__ = ["DecoderLM", "DecoderBlock", "pack_documents", "document_positions", "packed_lm_losses"]


def pack_documents(documents: list[Tensor], length: int, pad_id: int = 0) -> tuple[Tensor, Tensor]:
    """Pack 1-D token tensors into rows of ``length`` tokens, first fit in the given order.

    Returns input_ids (B, length) and document_ids (B, length): the index of each token's document
    in ``documents``, -1 on padding. A document longer than ``length`` is refused, not cut.
    """
    check_int("length", length, 1)
    rows: list[list[tuple[int, Tensor]]] = []
    room: list[int] = []
    for index, doc in enumerate(documents):
        if not isinstance(doc, Tensor) or doc.dim() != 1 or doc.numel() == 0:
            raise ValueError(f"documents[{index}] must be a non-empty 1-D tensor of token ids")
        if doc.numel() > length:
            raise ValueError(f"documents[{index}] has {doc.numel()} tokens > length={length}")
        row = next((r for r, free in enumerate(room) if free >= doc.numel()), None)
        if row is None:
            rows.append([])
            room.append(length)
            row = len(rows) - 1
        rows[row].append((index, doc))
        room[row] -= doc.numel()
    device = documents[0].device if documents else None
    input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long, device=device)
    document_ids = torch.full((len(rows), length), -1, dtype=torch.long, device=device)
    for r, packed in enumerate(rows):
        start = 0
        for index, doc in packed:
            input_ids[r, start : start + doc.numel()] = doc
            document_ids[r, start : start + doc.numel()] = index
            start += doc.numel()
    return input_ids, document_ids


def document_positions(document_ids: Tensor) -> Tensor:
    """(B, L) positions restarting at 0 where the document id changes (0 on padding)."""
    L = document_ids.shape[1]
    index = torch.arange(L, device=document_ids.device).expand_as(document_ids)
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    return torch.where(document_ids >= 0, index - first, torch.zeros_like(index))


def packed_lm_losses(logits: Tensor, input_ids: Tensor, document_ids: Tensor, num_documents: int) -> Tensor:
    """Per-document summed next-token cross-entropy (num_documents,) of a packed batch: a token
    predicts the next one only inside its own document (no loss across a boundary or on padding)."""
    targets = input_ids[:, 1:]
    same = (document_ids[:, 1:] == document_ids[:, :-1]) & (document_ids[:, :-1] >= 0)
    token_loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), targets.flatten(), reduction="none")
    ids = document_ids[:, :-1].flatten().clamp(min=0)
    weights = same.flatten().to(token_loss.dtype)
    return torch.zeros(num_documents, dtype=token_loss.dtype, device=logits.device).index_add(0, ids, token_loss * weights)


class DecoderBlock(nn.Module):
    """Pre-norm block: causal (windowed) self attention, then the MLP, each with a residual.

    Parameters: ``self_attn``, ``mlp``, ``attn_norm``, ``mlp_norm``.
    """

    window: int | None

    def __init__(self, config: DecoderConfig, rotary: RotaryEmbedding | None = None, layer: int = 0):
        super().__init__()
        c = config
        self.window = c.layer_window(layer)
        scale = (c.head_dim**-0.5 if c.scale_attention else 1.0) / (layer + 1 if c.scale_by_layer else 1)
        self.self_attn = MultiHeadAttention(c.d_model, c.num_heads, c.num_kv_heads, bias=c.has_bias("qkv"),
                                            dropout=c.dropout, rotary=rotary, head_dim=c.head_dim,
                                            out_bias=c.has_bias("out"), scale=scale)
        self.mlp: nn.Module
        if c.mlp == "gelu":
            self.mlp = FeedForward(c.d_model, c.d_ff, activation=c.mlp_activation, bias=c.has_bias("mlp"))
        else:
            self.mlp = GatedFeedForward(c.d_model, c.d_ff, bias=c.has_bias("mlp"), activation=c.mlp_activation)
        self.attn_norm = make_norm(c.norm, c.d_model, c.norm_eps)
        self.mlp_norm = make_norm(c.norm, c.d_model, c.norm_eps)
        self.dropout = Dropout(c.dropout)

    def forward(
        self, x: Tensor, mask: Tensor | BlockMask | None = None, *, key_mask: Tensor | None = None,
        cache: Attending | None = None, need_weights: bool = False, positions: Tensor | None = None,
        context_parallel=None,
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, L, D), key_mask (B, S) True at real tokens, mask an attention mask (packed documents'
        BlockMask) -> (B, L, D) and, with ``need_weights``, the attention weights (B, H, L, S)."""
        parts: dict[str, nn.Module] = self._modules  # type: ignore[assignment]  # from the registry: __getattr__ is 1 us a read
        dropout = parts["dropout"]
        # submodules called without nn.Module.__call__ where it would add nothing (called, normalised)
        attended = called(parts["self_attn"])(normalised(parts["attn_norm"], x), mask=mask, key_mask=key_mask,
                                              is_causal=True, window=self.window, cache=cache,
                                              need_weights=need_weights, positions=positions,
                                              context_parallel=context_parallel)
        x = x + dropout(attended.output)
        x = x + dropout(called(parts["mlp"])(normalised(parts["mlp_norm"], x)))
        return x, attended.weights


class DecoderLM(nn.Module):
    """Decoder-only LM. Parameters: ``tokens``, ``positions`` (learned only), ``layers``,
    ``norm``, ``lm_head`` (its weight is ``tokens.weight`` when tied)."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.config = c = config
        self.tokens = nn.Embedding(c.vocab_size, c.d_model)
        self.positions = LearnedPositionalEmbedding(c.max_len, c.d_model) if c.positional == "learned" else None
        rotary = None
        if c.positional == "rope":
            rotary = RotaryEmbedding(c.head_dim, c.rope_base, scaling=c.rope_scaling, factor=c.rope_factor,
                                     low_freq_factor=c.rope_low_freq_factor, high_freq_factor=c.rope_high_freq_factor,
                                     original_max_len=c.rope_original_max_len)
        self.layers = nn.ModuleList(DecoderBlock(c, rotary, layer) for layer in range(c.num_layers))
        self.norm = make_norm(c.norm, c.d_model, c.norm_eps)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.tokens.weight
        self.dropout = Dropout(c.dropout)

    def _blocks(self) -> list[DecoderBlock]:
        return [block for block in self.layers if isinstance(block, DecoderBlock)]

    def new_cache(self, *, sinks: int | None = None, window: int | None = None,
                  capacity: int | None = None) -> list[KVCache] | list[SinkCache] | list[FixedKVCache]:
        """One KV cache per layer; rolling (the last ``window`` positions) for sliding windows.

        With ``sinks`` (and ``window``): StreamingLLM's constant-memory cache
        (:class:`~attnkit.layers.SinkCache`), for generating and scoring past the trained context;
        ``sinks=0`` is the window-only baseline. Needs rotary positions and no model window.
        With ``capacity``: fixed-size caches (:class:`~attnkit.layers.FixedKVCache`) for decode
        steps of unchanging shapes (compiled, or CUDA graphs); prompt + new tokens <= capacity.
        """
        if capacity is not None:
            if sinks is not None or window is not None:
                raise ValueError("capacity= makes fixed-size caches; it takes no sinks= or window=")
            check_int("capacity", capacity, 1)
            if self.positions is not None and capacity > self.config.max_len:
                raise ValueError(f"capacity={capacity} exceeds this model's learned positions (max_len={self.config.max_len})")
            return [FixedKVCache(capacity) for _ in self._blocks()]
        if sinks is None:
            if window is not None:
                raise ValueError("window= is for a sinks cache; pass sinks= too (0 for a window-only cache)")
            return [KVCache(window=block.window) for block in self._blocks()]
        if self.config.positional != "rope" or any(layer.window is not None for layer in self.layers):
            raise ValueError("a sinks cache needs rotary positions and no sliding-window layers "
                             f"(this model: positional={self.config.positional!r}, window={self.config.window!r})")
        if window is None:
            raise ValueError("a sinks cache needs window= (the most recent keys each query attends)")
        return [SinkCache(sinks, window) for _ in self.layers]

    @kept.per_call
    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        *,
        cache: Sequence[Cache] | None = None,
        need_weights: bool = False,
        last_only: bool = False,
        position_ids: Tensor | None = None,
        document_ids: Tensor | None = None,
        context_parallel=None,
    ) -> LMOutput:
        """Logits for input_ids (B, L).

        Args:
            attention_mask: (B, S) True (or 1) at real tokens, S = the tokens so far, cached and new (or, with
                fixed-size caches, their capacity); each layer reads the columns its cache attends
                (:func:`~attnkit.models.blocks.layer_key_masks`); padded positions are never attended to.
            position_ids: (B, L) the positions of the new tokens, per row (after left padding:
                the count of real tokens before each); default: the cache's position onwards,
                from 0 at the first column.
            cache: from :meth:`new_cache`; the new tokens continue the cached ones.
            need_weights: also return each layer's attention weights (B, H, L, S).
            last_only: logits (B, 1, V) of the last position only (generation needs no more; the
                output layer is the largest matrix of a small LM).
            document_ids: (B, L) integers for packed sequences (:func:`attnkit.models.pack_documents`):
                each token attends only earlier tokens of its own document (a
                :func:`~attnkit.masks.document_mod` block mask, so the tiled backend skips the rest)
                and positions restart at 0 in each document unless ``position_ids`` says otherwise;
                negative ids mark padding. Not with ``attention_mask`` or ``cache``.
            context_parallel: (:class:`attnkit.distributed.ContextParallel`) input_ids (and
                attention_mask) are this process's shard of sequences split across processes
                (:func:`attnkit.distributed.lm_shards` gives matching labels); positions are the
                shard's global ones, every layer attends over the whole sequence exactly, the
                logits come back sharded. No cache, document_ids, position_ids or weights.
        """
        check_rank("input_ids", input_ids, 2, "(B, L)")
        B, L = input_ids.shape
        first = None if cache is None else cache[0]
        if check_context_parallel(context_parallel) is not None and (
                cache is not None or document_ids is not None or position_ids is not None or need_weights or last_only):
            raise ValueError("context_parallel takes no cache, document_ids, position_ids, need_weights or last_only")
        if document_ids is not None:
            if attention_mask is not None or cache is not None:
                raise ValueError("document_ids replaces attention_mask (mark padding with id -1) and takes no cache")
            if tuple(document_ids.shape) != (B, L) or document_ids.is_floating_point() or document_ids.dtype == torch.bool:
                raise ValueError(f"document_ids must be integers of shape (B, L) = ({B}, {L}), got "
                                 f"{document_ids.dtype} {tuple(document_ids.shape)}")
        position_ids, rotary_positions, offset = self._positions(input_ids, first, position_ids, document_ids,
                                                                 context_parallel)
        key_masks = layer_key_masks(attention_mask, B, L, cache)  # (B, S_i) per layer
        mask = None if document_ids is None else document_block_mask(document_ids)  # closed form: no pass over L x L
        x = self.tokens(input_ids)
        if self.positions is not None:
            x = self.positions(x, offset) if position_ids is None else x + self.positions.embedding(position_ids)
        x = self.dropout(x)
        attentions: list[Tensor] | None = [] if need_weights else None
        for i, layer in enumerate(self.layers):
            key_mask = None if key_masks is None else key_masks[0 if cache is None else i]
            x, weights = called(layer)(x, mask, key_mask=key_mask, cache=None if cache is None else cache[i],
                                       need_weights=need_weights,
                                       positions=rotary_positions, context_parallel=context_parallel)
            if attentions is not None:
                attentions.append(weights)
        x = normalised(self._modules["norm"], x)
        return LMOutput(project_by_name(self, "lm_head", x[:, -1:] if last_only else x), x, attentions)

    def _positions(self, input_ids: Tensor, cache, position_ids: Tensor | None, document_ids: Tensor | None,
                   context_parallel) -> tuple[Tensor | None, Tensor | None, int]:
        """(position ids (B, L) or None, rotary positions (B, L) or (L,) or None, offset): from the user,
        the shard (context parallelism), the documents, or the cache (its columns, or its count)."""
        B, L = input_ids.shape
        device_positions = False  # positions the cache holds on the device: never read back
        if context_parallel is not None:
            shard_positions = context_parallel.positions(L).to(input_ids.device)  # (L,) global
            return shard_positions.expand(B, L), shard_positions, 0
        if document_ids is not None and position_ids is None:
            position_ids = document_positions(document_ids)
        if cache is not None:
            from_cache = cache.new_positions(L, input_ids.device)
            device_positions = from_cache is not None
            if position_ids is None and from_cache is not None:
                position_ids = from_cache.expand(B, L)
        offset = 0 if cache is None or device_positions else cache.position
        if position_ids is not None:
            if tuple(position_ids.shape) != (B, L) or position_ids.dtype != torch.long:
                raise ValueError(f"position_ids must be int64 of shape (B, L) = ({B}, {L}), got "
                                 f"{position_ids.dtype} {tuple(position_ids.shape)}")
            if self.positions is not None and position_ids.numel() and not device_positions:  # a table lookup: check
                # the range (rotary positions take any value; reading them waits for the device, and a fixed
                # cache's capacity <= max_len was checked by new_cache)
                top, bottom = int(position_ids.max()), int(position_ids.min())
                if top >= self.config.max_len or bottom < 0:
                    raise ValueError(f"position_ids must lie in [0, {self.config.max_len}), got {bottom}..{top}")
        elif self.positions is not None and offset + L > self.config.max_len:
            raise ValueError(f"positions {offset}..{offset + L - 1} exceed max_len={self.config.max_len}")
        return position_ids, position_ids, offset
