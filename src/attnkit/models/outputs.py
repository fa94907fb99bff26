"""What the model families return, and the one check of a source batch they share.

Shapes: B batch, S source length, T target length, L tokens, D model dim, V vocabulary, H heads.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..functional.checks import check_rank
from ..functional.tracing import exportable

__all__ = ["TranslationOutput", "StepOutput", "LMOutput", "EncoderOutput", "check_source"]


@exportable
class TranslationOutput(NamedTuple):
    """Teacher-forced output of an encoder-decoder."""

    logits: Tensor  # (B, T, V)
    weights: Tensor | None  # (B, T, S) alignment, None without attention


@exportable
class StepOutput(NamedTuple):
    """One decoding step of an encoder-decoder."""

    logits: Tensor  # (B, V)
    weights: Tensor | None  # (B, S)


@exportable
class LMOutput(NamedTuple):
    """Output of a decoder-only language model."""

    logits: Tensor  # (B, L, V)
    hidden_states: Tensor  # (B, L, D) after the final norm
    attentions: list[Tensor] | None  # per layer (B, H, L, S), when asked for


@exportable
class EncoderOutput(NamedTuple):
    """Output of an encoder-only model."""

    hidden_states: Tensor  # (B, L, D) last layer
    pooled: Tensor | None  # (B, D) pooler output, None without a pooler
    attentions: list[Tensor] | None  # per layer (B, H, L, L), when asked for


def check_source(source: Tensor, source_lengths: Tensor) -> None:
    """source (B, S) long ids, source_lengths (B,) with 1 <= length <= S."""
    check_rank("source", source, 2, "(B, S)")
    if source.dtype != torch.long:
        raise TypeError(f"source must hold int64 token ids, got {source.dtype}")
    if tuple(source_lengths.shape) != (source.shape[0],):
        raise ValueError(f"source_lengths must have shape (B,) = ({source.shape[0]},), got {tuple(source_lengths.shape)}")
    if source_lengths.numel() and (source_lengths.min() < 1 or source_lengths.max() > source.shape[1]):
        raise ValueError(f"source_lengths must lie in [1, S={source.shape[1]}], got {source_lengths.tolist()}")
