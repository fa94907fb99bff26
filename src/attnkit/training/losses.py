"""Losses of a translation model: token ids of pairs, the summed cross entropy of a batch under teacher
forcing, and the mean validation loss."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..data.batching import collate
from ..data.corpus import Pair
from ..data.tokenizer import PAD, Tokenizer

__all__ = ["encode_pairs", "loss_sum", "cross_entropy_sum", "evaluate_loss"]


def encode_pairs(pairs: Sequence[Pair], source: Tokenizer, target: Tokenizer) -> list[tuple[list[int], list[int]]]:
    """Token ids of each pair (no specials); pairs with an empty side are dropped."""
    sources = source.encode_batch([p.source for p in pairs])
    targets = target.encode_batch([p.target for p in pairs])
    return [(s, t) for s, t in zip(sources, targets) if s and t]


def loss_sum(model: nn.Module, batch, label_smoothing: float) -> torch.Tensor:
    logits = model(batch.source, batch.source_lengths, batch.target_in).logits  # (B, T, V)
    return cross_entropy_sum(logits, batch, label_smoothing)


def cross_entropy_sum(logits: torch.Tensor, batch, label_smoothing: float) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), batch.target_out.flatten(), ignore_index=PAD,
                           label_smoothing=label_smoothing, reduction="sum")


@torch.no_grad()
def evaluate_loss(model: nn.Module, data: Sequence[tuple[list[int], list[int]]], batch_size: int = 128) -> float:
    """Mean per-token cross entropy (nats, no smoothing) of ``data`` under teacher forcing."""
    was_training = model.training
    model.eval()
    total = tokens = 0.0
    order = sorted(range(len(data)), key=lambda i: len(data[i][0]))
    for start in range(0, len(order), batch_size):
        chunk = [data[i] for i in order[start : start + batch_size]]
        batch = collate([s for s, _ in chunk], [t for _, t in chunk]).to(next(model.parameters()).device)
        total += float(loss_sum(model, batch, 0.0))
        tokens += batch.target_tokens
    model.train(was_training)
    return total / max(tokens, 1)
