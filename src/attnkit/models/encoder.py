"""Encoder-only Transformer of the BERT family (Devlin et al. 2019), built from the same
:class:`~attnkit.models.transformer.EncoderLayer` as the Vaswani encoder (post-norm, GELU).

    h_0 = LayerNorm(E_token + E_position + E_segment),  h_l = EncoderLayer(h_{l-1}),
    pooled = tanh(W h_L[CLS] + b)

Shapes: B batch, L length, D model dim.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..distributed import check_context_parallel
from ..functional import kept
from ..functional.checks import check_rank
from ..layers import LearnedPositionalEmbedding
from .config import EncoderConfig
from .outputs import EncoderOutput
from .transformer import EncoderLayer

__all__ = ["EncoderModel", "mean_pool"]


def mean_pool(hidden_states: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean of the real tokens' vectors (sentence-transformers' mean pooling): (B, L, D), (B, L) -> (B, D)."""
    weights = attention_mask.to(hidden_states.dtype)[..., None]  # (B, L, 1)
    return (hidden_states * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


class _Embeddings(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        c = config
        self.tokens = nn.Embedding(c.vocab_size, c.d_model)
        self.positions = LearnedPositionalEmbedding(c.max_len, c.d_model)
        self.token_types = nn.Embedding(c.type_vocab_size, c.d_model)
        self.norm = nn.LayerNorm(c.d_model, eps=c.norm_eps)
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, ids: Tensor, token_type_ids: Tensor, position_ids: Tensor | None = None) -> Tensor:
        x = self.tokens(ids)
        x = self.positions(x) if position_ids is None else x + self.positions.embedding(position_ids)
        return self.dropout(self.norm(x + self.token_types(token_type_ids)))


class EncoderModel(nn.Module):
    """BERT-style encoder. Parameters: ``embeddings`` (tokens, positions, token_types, norm),
    ``layers`` (:class:`EncoderLayer`), ``pooler`` (optional)."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = c = config
        self.embeddings = _Embeddings(c)
        self.layers = nn.ModuleList(
            EncoderLayer(c.d_model, c.num_heads, c.d_ff, dropout=c.dropout, activation=c.activation, norm_eps=c.norm_eps)
            for _ in range(c.num_layers)
        )
        self.pooler = nn.Linear(c.d_model, c.d_model) if c.pooler else None

    @kept.per_call
    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        *,
        need_weights: bool = False,
        context_parallel=None,
    ) -> EncoderOutput:
        """input_ids (B, L); attention_mask (B, L) True (or 1) at real tokens; token_type_ids (B, L).

        ``context_parallel`` (:class:`attnkit.distributed.ContextParallel`): the inputs are this
        process's shard of sequences split across processes (:meth:`ContextParallel.shard`), the
        hidden states come back sharded the same way, positions are the shard's global ones, and
        ``pooled`` is None (the [CLS] token lives on one process).
        """
        check_rank("input_ids", input_ids, 2, "(B, L)")
        B, L = input_ids.shape
        position_ids = None
        if check_context_parallel(context_parallel) is not None:
            if need_weights:
                raise ValueError("context_parallel returns no attention weights (need_weights=False)")
            position_ids = context_parallel.positions(L).to(input_ids.device)
            if int(position_ids.max()) >= self.config.max_len:
                raise ValueError(f"the sequence has {L * context_parallel.world} tokens across processes, more "
                                 f"than max_len={self.config.max_len}")
        elif L > self.config.max_len:
            raise ValueError(f"input_ids has L={L} tokens, more than max_len={self.config.max_len}")
        key_mask = None
        if attention_mask is not None:
            if tuple(attention_mask.shape) != (B, L):
                raise ValueError(f"attention_mask must have shape (B, L) = ({B}, {L}), got {tuple(attention_mask.shape)}")
            key_mask = attention_mask.bool()  # (B, L)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids, None if position_ids is None else position_ids.expand(B, L))
        attentions: list[Tensor] | None = [] if need_weights else None
        for layer in self.layers:
            x, weights = layer(x, key_mask=key_mask, need_weights=need_weights, context_parallel=context_parallel)
            if attentions is not None:
                attentions.append(weights)
        pooled = torch.tanh(self.pooler(x[:, 0])) if self.pooler is not None and context_parallel is None else None
        return EncoderOutput(x, pooled, attentions)
