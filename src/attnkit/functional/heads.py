"""Splitting the model dim into heads and back: the one place these reshapes live."""

from __future__ import annotations

import torch
from torch import Tensor

from .tracing import exporting

__all__ = ["split_heads", "merge_heads", "repeat_kv"]


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """(B, L, num_heads * E) -> (B, num_heads, L, E)."""
    B, L, width = x.shape
    if width % num_heads:
        raise ValueError(f"last dim {width} is not divisible by num_heads={num_heads}")
    return x.view(B, L, num_heads, width // num_heads).transpose(1, 2)  # (B, H, L, E)


def merge_heads(x: Tensor) -> Tensor:
    """(B, H, L, E) -> (B, L, H * E)."""
    B, H, L, E = x.shape
    return x.transpose(1, 2).reshape(B, L, H * E)  # (B, L, H*E)


def repeat_kv(x: Tensor, groups: int) -> Tensor:
    """(B, Hkv, S, E) keys or values -> (B, Hkv * groups, S, E), each head repeated for the
    ``groups`` consecutive query heads that read it (for kernels that take no grouped heads)."""
    if groups == 1:
        return x
    if exporting():  # a gather: torch 2.11's export turns repeat_interleave's view into guards that refuse
        # dynamic lengths; the same copy
        return x.index_select(1, torch.arange(x.shape[1] * groups, device=x.device) // groups)
    return x.repeat_interleave(groups, dim=1)
