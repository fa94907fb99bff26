"""Splitting the model dim into heads and back: the one place these reshapes live."""

from __future__ import annotations

from torch import Tensor

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
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)
