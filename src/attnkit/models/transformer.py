"""The Transformer (Vaswani et al. 2017, "Attention Is All You Need"): blocks, encoder, decoder and
the encoder-decoder, all built on :class:`attnkit.MultiHeadAttention`.

    post-norm (the paper):  x = LayerNorm(x + Dropout(Sublayer(x)))
    pre-norm:               x = x + Dropout(Sublayer(LayerNorm(x))),  a final LayerNorm per stack

Shapes: B batch, S source length, T target length, D model dim, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..functional import kept, masks
from ..functional.checks import check_rank
from ..layers import KVCache, LearnedPositionalEmbedding, MultiHeadAttention, SinusoidalPositionalEncoding
from .blocks import Dropout, FeedForward
from .config import PAD_ID, TransformerConfig
from .outputs import StepOutput, TranslationOutput, check_source

__all__ = [
    "EncoderLayer",
    "DecoderLayer",
    "TransformerEncoder",
    "TransformerDecoder",
    "TransformerEncoderDecoder",
]


class EncoderLayer(nn.Module):
    """Self attention then feed-forward, each with a residual connection, dropout and LayerNorm
    (the Transformer encoder; BERT with ``activation="gelu"``, ``norm_eps=1e-12``).

    Parameters: ``self_attn``, ``feed_forward``, ``attn_norm``, ``ff_norm``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        *,
        dropout: float = 0.0,
        norm_first: bool = False,
        activation: str = "relu",
        norm_eps: float = 1e-5,
        bias: bool = True,
    ):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, bias=bias, dropout=dropout)
        self.feed_forward = FeedForward(d_model, d_ff, dropout, activation=activation)
        self.attn_norm = nn.LayerNorm(d_model, eps=norm_eps)
        self.ff_norm = nn.LayerNorm(d_model, eps=norm_eps)
        self.dropout = Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, mask: Tensor | None = None, *, key_mask: Tensor | None = None,
                need_weights: bool = False, context_parallel=None) -> tuple[Tensor, Tensor | None]:
        """x (B, S, D), mask an attention mask (e.g. (B, 1, 1, S) of an encoder-decoder's source),
        key_mask (B, S) True at real tokens -> (B, S, D) and, with ``need_weights``, the attention
        weights (B, H, S, S). ``context_parallel``: x is this process's shard of a sequence split
        across processes (see :class:`attnkit.distributed.ContextParallel`)."""
        if self.norm_first:
            attended = self.self_attn(self.attn_norm(x), mask=mask, key_mask=key_mask, need_weights=need_weights,
                                      context_parallel=context_parallel)
            x = x + self.dropout(attended.output)
            x = x + self.dropout(self.feed_forward(self.ff_norm(x)))
        else:
            attended = self.self_attn(x, mask=mask, key_mask=key_mask, need_weights=need_weights,
                                      context_parallel=context_parallel)
            x = self.attn_norm(x + self.dropout(attended.output))
            x = self.ff_norm(x + self.dropout(self.feed_forward(x)))
        return x, attended.weights


class DecoderLayer(nn.Module):
    """Causal self attention, cross attention to the encoder output, then feed-forward, each with
    a residual connection, dropout and LayerNorm.

    Parameters: ``self_attn``, ``cross_attn``, ``feed_forward``, ``self_norm``, ``cross_norm``, ``ff_norm``.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, *, dropout: float = 0.0, norm_first: bool = False,
                 bias: bool = True):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, bias=bias, dropout=dropout)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, bias=bias, dropout=dropout)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.self_norm = nn.LayerNorm(d_model)
        self.cross_norm = nn.LayerNorm(d_model)
        self.ff_norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.norm_first = norm_first

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        memory_mask: Tensor | None = None,
        *,
        self_cache: KVCache | None = None,
        cross_cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, T, D), memory (B, S, D), memory_mask (B, 1, 1, S) -> (B, T, D) and the cross
        attention weights (B, H, T, S) when ``need_weights``."""
        if self.norm_first:
            x = x + self.dropout(self.self_attn(self.self_norm(x), is_causal=True, cache=self_cache).output)
            crossed = self.cross_attn(self.cross_norm(x), memory, mask=memory_mask, cache=cross_cache,
                                      need_weights=need_weights)
            x = x + self.dropout(crossed.output)
            x = x + self.dropout(self.feed_forward(self.ff_norm(x)))
        else:
            x = self.self_norm(x + self.dropout(self.self_attn(x, is_causal=True, cache=self_cache).output))
            crossed = self.cross_attn(x, memory, mask=memory_mask, cache=cross_cache, need_weights=need_weights)
            x = self.cross_norm(x + self.dropout(crossed.output))
            x = self.ff_norm(x + self.dropout(self.feed_forward(x)))
        return x, crossed.weights


class _Embedding(nn.Module):
    """Token embedding times sqrt(D) plus positions, then dropout (section 3.4, 3.5)."""

    def __init__(self, vocab: int, config: TransformerConfig, tokens: nn.Embedding | None = None):
        super().__init__()
        c = config
        self.tokens = tokens if tokens is not None else nn.Embedding(vocab, c.d_model, padding_idx=PAD_ID)
        self.positions: nn.Module
        if c.positional == "sinusoidal":
            self.positions = SinusoidalPositionalEncoding(c.d_model, c.max_len)
        else:
            self.positions = LearnedPositionalEmbedding(c.max_len, c.d_model)
        self.scale = math.sqrt(c.d_model)
        self.dropout = Dropout(c.dropout)

    def forward(self, ids: Tensor, offset: int = 0) -> Tensor:
        return self.dropout(self.positions(self.tokens(ids) * self.scale, offset))


class TransformerEncoder(nn.Module):
    """A stack of :class:`EncoderLayer` (plus a final LayerNorm when pre-norm)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        c = config
        self.layers = nn.ModuleList(
            EncoderLayer(c.d_model, c.num_heads, c.d_ff, dropout=c.dropout, norm_first=c.norm == "pre", bias=c.bias)
            for _ in range(c.encoder_layers)
        )
        self.norm = nn.LayerNorm(config.d_model) if config.norm == "pre" else nn.Identity()

    @kept.per_call
    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        for layer in self.layers:
            x, _ = layer(x, mask)
        return self.norm(x)


class TransformerDecoder(nn.Module):
    """A stack of :class:`DecoderLayer` (plus a final LayerNorm when pre-norm)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        c = config
        self.layers = nn.ModuleList(
            DecoderLayer(c.d_model, c.num_heads, c.d_ff, dropout=c.dropout, norm_first=c.norm == "pre", bias=c.bias)
            for _ in range(c.decoder_layers)
        )
        self.norm = nn.LayerNorm(config.d_model) if config.norm == "pre" else nn.Identity()

    @kept.per_call
    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        memory_mask: Tensor | None = None,
        *,
        caches: list[tuple[KVCache, KVCache]] | None = None,
        need_weights: bool = False,
        weights_layer: int = -1,
    ) -> tuple[Tensor, Tensor | None]:
        """-> (B, T, D) and the cross-attention weights (B, H, T, S) of layer ``weights_layer``
        (default the last) if asked."""
        count = len(self.layers)
        if not -count <= weights_layer < count:
            raise ValueError(f"weights_layer must be in [{-count}, {count}), got {weights_layer}")
        chosen = weights_layer % count
        weights = None
        for i, layer in enumerate(self.layers):
            self_cache, cross_cache = caches[i] if caches is not None else (None, None)
            x, layer_weights = layer(x, memory, memory_mask, self_cache=self_cache, cross_cache=cross_cache,
                                     need_weights=need_weights and i == chosen)
            if i == chosen:
                weights = layer_weights
        return self.norm(x), weights


@dataclass
class TransformerState:
    """Encoder output and per-layer caches for incremental decoding; :meth:`reorder` follows beams."""

    memory: Tensor  # (B, S, D)
    memory_mask: Tensor  # (B, 1, 1, S)
    caches: list[tuple[KVCache, KVCache]]  # (self attention, cross attention) per decoder layer
    offset: int = 0  # target positions decoded so far

    def reorder(self, index: Tensor, *, within_source: bool = False) -> None:
        """Rows ``index`` of the state. ``within_source``: every row moves among the copies of one
        source (beam search after the first step), so the memory, its mask and the cross-attention
        caches, the same in all its copies, stay where they are; only the self-attention caches move."""
        if not within_source:
            self.memory = self.memory.index_select(0, index)
            self.memory_mask = self.memory_mask.index_select(0, index)
        for self_cache, cross_cache in self.caches:
            self_cache.reorder(index)
            if not within_source:
                cross_cache.reorder(index)


class TransformerEncoderDecoder(nn.Module):
    """Embeddings, :class:`TransformerEncoder`, :class:`TransformerDecoder`, and the output layer.

    Parameters: ``source_embedding``, ``target_embedding`` (one shared module when
    ``share_embeddings``), ``encoder``, ``decoder``, ``generator`` (D -> V, its weight tied to the
    embedding when shared).
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = c = config
        self.source_embedding = _Embedding(c.source_vocab, c)
        shared = self.source_embedding.tokens if c.share_embeddings else None
        self.target_embedding = _Embedding(c.target_vocab, c, tokens=shared)
        self.encoder = TransformerEncoder(c)
        self.decoder = TransformerDecoder(c)
        self.generator = nn.Linear(c.d_model, c.target_vocab)
        if c.share_embeddings:
            self.generator.weight = self.source_embedding.tokens.weight
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        """Xavier-uniform matrices (as torch.nn.Transformer); embeddings N(0, D^-1/2)."""
        for name, parameter in self.named_parameters():
            if parameter.dim() > 1 and "tokens" not in name:
                nn.init.xavier_uniform_(parameter)
        embeddings = [self.source_embedding.tokens]
        if self.target_embedding.tokens is not self.source_embedding.tokens:
            embeddings.append(self.target_embedding.tokens)
        for embedding in embeddings:  # a list, not a set: the init order must not depend on ids
            nn.init.normal_(embedding.weight, std=self.config.d_model**-0.5)
            with torch.no_grad():
                embedding.weight[PAD_ID].zero_()

    def encode(self, source: Tensor, source_lengths: Tensor) -> TransformerState:
        """Encode source (B, S) with lengths (B,); return the state for :meth:`step`."""
        check_source(source, source_lengths)
        memory_mask = masks.padding(source_lengths.to(source.device), source.shape[1])  # (B, 1, 1, S)
        memory = self.encoder(self.source_embedding(source), memory_mask)
        caches = [(KVCache(), KVCache(static=True)) for _ in self.decoder.layers]
        return TransformerState(memory, memory_mask, caches)

    def step(self, state: TransformerState, tokens: Tensor) -> StepOutput:
        """Decode one position from the previous tokens (B,) using the caches; -> logits (B, V) and
        the last layer's cross-attention weights averaged over heads (B, S)."""
        x = self.target_embedding(tokens[:, None], offset=state.offset)
        x, weights = self.decoder(x, state.memory, state.memory_mask, caches=state.caches, need_weights=True)
        state.offset += 1
        return StepOutput(self.generator(x[:, 0]), weights[:, :, 0].mean(1))

    @kept.per_call
    def forward(
        self, source: Tensor, source_lengths: Tensor, target_in: Tensor, *, need_weights: bool = False,
        weights_layer: int = -1, weights_head: int | None = None,
    ) -> TranslationOutput:
        """Teacher-forced logits (B, T, V) for target_in (B, T); with ``need_weights`` also the cross
        attention (B, T, S) of decoder layer ``weights_layer`` (default the last), averaged over heads
        or of head ``weights_head`` (guided alignment trains one head, Garg et al. 2019)."""
        check_rank("target_in", target_in, 2, "(B, T)")
        heads = self.config.num_heads
        if weights_head is not None and not 0 <= weights_head < heads:
            raise ValueError(f"weights_head must be None (average) or in [0, {heads}), got {weights_head}")
        state = self.encode(source, source_lengths)
        x, weights = self.decoder(self.target_embedding(target_in), state.memory, state.memory_mask,
                                  need_weights=need_weights, weights_layer=weights_layer)
        if weights is not None:
            weights = weights.mean(1) if weights_head is None else weights[:, weights_head]
        return TranslationOutput(self.generator(x), weights)
