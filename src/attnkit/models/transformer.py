"""The Transformer (Vaswani et al. 2017, "Attention Is All You Need"): blocks, encoder, decoder and
the encoder-decoder, all built on :class:`attnkit.MultiHeadAttention`.

    post-norm (the paper):  x = LayerNorm(x + Dropout(Sublayer(x)))
    pre-norm:               x = x + Dropout(Sublayer(LayerNorm(x))),  a final LayerNorm per stack

Shapes: B batch, S source length, T target length, D model dim, V vocabulary.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.tokenizer import PAD
from ..functional import masks
from ..functional._checks import check_rank
from ..layers import KVCache, LearnedPositionalEmbedding, MultiHeadAttention, SinusoidalPositionalEncoding
from .config import TransformerConfig
from .seq2seq import StepOutput, TranslationOutput, check_source

__all__ = [
    "FeedForward",
    "GatedFeedForward",
    "Residual",
    "EncoderLayer",
    "DecoderLayer",
    "TransformerEncoder",
    "TransformerDecoder",
    "TransformerEncoderDecoder",
    "count_parameters",
]


def count_parameters(module: nn.Module) -> int:
    """Number of distinct parameters (tied weights count once)."""
    return sum(p.numel() for p in module.parameters())


ACTIVATIONS = {
    "relu": torch.relu,
    "gelu": F.gelu,  # exact (erf) GELU: BERT
    "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),  # GPT-2's "gelu_new"
    "silu": F.silu,  # Swish: Llama's gate
}


class FeedForward(nn.Module):
    """FFN(x) = act(x W_1 + b_1) W_2 + b_2 (Vaswani et al. eq. 2 with ReLU; GELU in BERT and GPT-2)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, *, activation: str = "relu", bias: bool = True):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.activation = ACTIVATIONS[activation]
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


class GatedFeedForward(nn.Module):
    """Gated linear unit (Shazeer 2020): down(act(gate(x)) * up(x)); SwiGLU (silu) as in Llama,
    GeGLU with a GELU."""

    def __init__(self, d_model: int, d_ff: int, *, bias: bool = False, activation: str = "silu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.gate_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)
        self.activation = ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.activation(self.gate_proj(x)) * self.up_proj(x))


class Residual(nn.Module):
    """One sub-layer connection: the norm, the residual and its dropout, placed pre or post."""

    def __init__(self, norm: nn.Module, dropout: float, norm_first: bool):
        super().__init__()
        self.norm = norm
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, sublayer) -> Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """Self attention then feed-forward, each wrapped in a residual connection and LayerNorm
    (the Transformer encoder; BERT with ``activation="gelu"``, ``norm_eps=1e-12``)."""

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
        self.attn_block = Residual(nn.LayerNorm(d_model, eps=norm_eps), dropout, norm_first)
        self.ff_block = Residual(nn.LayerNorm(d_model, eps=norm_eps), dropout, norm_first)

    def forward(self, x: Tensor, mask: Tensor | None = None, *, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x (B, S, D), mask (B, 1, 1, S) True at real tokens -> (B, S, D) and, with
        ``need_weights``, the attention weights (B, H, S, S)."""
        weights = []

        def attend(h: Tensor) -> Tensor:
            result = self.self_attn(h, mask=mask, need_weights=need_weights)
            weights.append(result.weights)
            return result.output

        return self.ff_block(self.attn_block(x, attend), self.feed_forward), weights[0]


class DecoderLayer(nn.Module):
    """Causal self attention, cross attention to the encoder output, then feed-forward."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, *, dropout: float = 0.0, norm_first: bool = False,
                 bias: bool = True):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, bias=bias, dropout=dropout)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, bias=bias, dropout=dropout)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.self_block = Residual(nn.LayerNorm(d_model), dropout, norm_first)
        self.cross_block = Residual(nn.LayerNorm(d_model), dropout, norm_first)
        self.ff_block = Residual(nn.LayerNorm(d_model), dropout, norm_first)

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
        x = self.self_block(x, lambda h: self.self_attn(h, is_causal=True, cache=self_cache).output)
        weights = []

        def cross(h: Tensor) -> Tensor:
            result = self.cross_attn(h, memory, mask=memory_mask, cache=cross_cache, need_weights=need_weights)
            weights.append(result.weights)
            return result.output

        x = self.cross_block(x, cross)
        return self.ff_block(x, self.feed_forward), weights[0]


class _Embedding(nn.Module):
    """Token embedding times sqrt(D) plus positions, then dropout (section 3.4, 3.5)."""

    def __init__(self, vocab: int, config: TransformerConfig, tokens: nn.Embedding | None = None):
        super().__init__()
        c = config
        self.tokens = tokens if tokens is not None else nn.Embedding(vocab, c.d_model, padding_idx=PAD)
        if c.positional == "sinusoidal":
            self.positions = SinusoidalPositionalEncoding(c.d_model, c.max_len)
        else:
            self.positions = LearnedPositionalEmbedding(c.max_len, c.d_model)
        self.scale = math.sqrt(c.d_model)
        self.dropout = nn.Dropout(c.dropout)

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

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        memory_mask: Tensor | None = None,
        *,
        caches: list[tuple[KVCache, KVCache]] | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """-> (B, T, D) and the last layer's cross-attention weights (B, H, T, S) if asked."""
        weights = None
        for i, layer in enumerate(self.layers):
            last = i == len(self.layers) - 1
            self_cache, cross_cache = caches[i] if caches is not None else (None, None)
            x, weights = layer(x, memory, memory_mask, self_cache=self_cache, cross_cache=cross_cache,
                               need_weights=need_weights and last)
        return self.norm(x), weights


@dataclass
class TransformerState:
    """Encoder output and per-layer caches for incremental decoding; :meth:`reorder` follows beams."""

    memory: Tensor  # (B, S, D)
    memory_mask: Tensor  # (B, 1, 1, S)
    caches: list[tuple[KVCache, KVCache]]  # (self attention, cross attention) per decoder layer
    offset: int = 0  # target positions decoded so far

    def reorder(self, index: Tensor) -> None:
        self.memory = self.memory.index_select(0, index)
        self.memory_mask = self.memory_mask.index_select(0, index)
        for self_cache, cross_cache in self.caches:
            self_cache.reorder(index)
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
                embedding.weight[PAD].zero_()

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

    def forward(
        self, source: Tensor, source_lengths: Tensor, target_in: Tensor, *, need_weights: bool = False
    ) -> TranslationOutput:
        """Teacher-forced logits (B, T, V) for target_in (B, T); with ``need_weights`` also the last
        decoder layer's cross attention averaged over heads (B, T, S)."""
        check_rank("target_in", target_in, 2, "(B, T)")
        state = self.encode(source, source_lengths)
        x, weights = self.decoder(self.target_embedding(target_in), state.memory, state.memory_mask,
                                  need_weights=need_weights)
        return TranslationOutput(self.generator(x), None if weights is None else weights.mean(1))
