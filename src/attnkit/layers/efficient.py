"""Efficient attention variants as layers with the same (B, L, D) interface as
:class:`~attnkit.MultiHeadAttention`: linear attention (Katharopoulos et al. 2020), Performer
FAVOR+ (Choromanski et al. 2021) and Linformer (Wang et al. 2020). The exact sliding window is
not here: it is ``window=`` on :func:`attnkit.attention` and on ``MultiHeadAttention``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .._deprecated import UNSET, renamed
from ..functional import attention
from ..functional.attention import AttentionOutput
from ..functional.checks import check_rank
from ..functional.heads import merge_heads, split_heads
from ..functional.linear import (
    causal_linear_step,
    elu_feature_map,
    favor_features,
    linear_attention,
    orthogonal_projection,
)

__all__ = ["LinearAttention", "PerformerAttention", "LinformerAttention"]


class _Projections(nn.Module):
    """q_proj, k_proj, v_proj, out_proj over D, as in MultiHeadAttention."""

    def __init__(self, d_model: int, num_heads: int, bias: bool):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model must be divisible by num_heads, got d_model={d_model}, num_heads={num_heads}")
        self.d_model, self.num_heads, self.head_dim = d_model, num_heads, d_model // num_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def heads(self, query: Tensor, key: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        check_rank("query", query, 3, "(B, L, D)")
        key = query if key is None else key
        check_rank("key", key, 3, "(B, S, D)")
        q = split_heads(self.q_proj(query), self.num_heads)  # (B, H, L, E)
        return q, split_heads(self.k_proj(key), self.num_heads), split_heads(self.v_proj(key), self.num_heads)


class LinearAttention(_Projections):
    """Linear attention with the elu+1 feature map; ``is_causal=True`` is the RNN form, and
    :meth:`step` decodes one token with a constant-size state."""

    def __init__(self, d_model: int, num_heads: int, *, bias: bool = True):
        super().__init__(d_model, num_heads, bias)

    def forward(self, query: Tensor, key: Tensor | None = None, *, is_causal=UNSET,
                key_mask: Tensor | None = None, causal=UNSET) -> AttentionOutput:
        """query (B, L, D), key (= value source) (B, S, D), key_mask (B, S) True at real keys ->
        :class:`AttentionOutput` with output (B, L, D) (no weights: linear attention never forms them).
        ``causal`` is the deprecated old name of ``is_causal``."""
        is_causal = renamed("LinearAttention", "causal", "is_causal", causal, is_causal, False)
        q, k, v = self.heads(query, key)
        out = linear_attention(elu_feature_map(q), elu_feature_map(k), v, is_causal=is_causal, key_mask=key_mask)
        return AttentionOutput(output=self.out_proj(merge_heads(out)))

    def step(self, x: Tensor, state=None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """One token x (B, D) -> output (B, D) and the new state (causal form)."""
        q, k, v = (proj(x).view(x.shape[0], self.num_heads, self.head_dim) for proj in (self.q_proj, self.k_proj, self.v_proj))
        out, state = causal_linear_step(elu_feature_map(q), elu_feature_map(k), v, state)
        return self.out_proj(out.reshape(x.shape[0], self.d_model)), state


class PerformerAttention(_Projections):
    """Performer: softmax attention estimated with ``num_features`` positive orthogonal random
    features (a fixed, seeded projection buffer; :meth:`redraw` draws a new one)."""

    projection: Tensor

    def __init__(self, d_model: int, num_heads: int, num_features: int = 256, *, bias: bool = True, seed: int = 0):
        super().__init__(d_model, num_heads, bias)
        if num_features < 1:
            raise ValueError(f"num_features must be >= 1, got {num_features}")
        self.num_features = num_features
        self.register_buffer("projection", torch.empty(num_features, self.head_dim))
        self.redraw(torch.Generator().manual_seed(seed))

    def redraw(self, generator: torch.Generator | None = None) -> None:
        self.projection.copy_(orthogonal_projection(self.num_features, self.head_dim, generator=generator))

    def forward(self, query: Tensor, key: Tensor | None = None, *, is_causal=UNSET,
                key_mask: Tensor | None = None, causal=UNSET) -> AttentionOutput:
        """As :meth:`LinearAttention.forward`; ``causal`` is the deprecated old name of ``is_causal``."""
        is_causal = renamed("PerformerAttention", "causal", "is_causal", causal, is_causal, False)
        q, k, v = self.heads(query, key)
        phi_q = favor_features(q, self.projection, is_query=True)
        phi_k = favor_features(k, self.projection, is_query=False, is_causal=is_causal)
        out = linear_attention(phi_q, phi_k, v, is_causal=is_causal, key_mask=key_mask)
        return AttentionOutput(output=self.out_proj(merge_heads(out)))


class LinformerAttention(_Projections):
    """Linformer: keys and values are projected along the length, (S -> k) with learned
    E, F of shape (k, max_len), then exact softmax attention over the k projected positions;
    linear in S. Not causal (the projection mixes all positions)."""

    def __init__(self, d_model: int, num_heads: int, max_len: int, projected_len: int, *, bias: bool = True):
        super().__init__(d_model, num_heads, bias)
        if not 1 <= projected_len:
            raise ValueError(f"projected_len must be >= 1, got {projected_len}")
        self.max_len, self.projected_len = max_len, projected_len
        self.key_length_proj = nn.Parameter(torch.randn(projected_len, max_len) / max_len**0.5)  # E
        self.value_length_proj = nn.Parameter(torch.randn(projected_len, max_len) / max_len**0.5)  # F

    def forward(self, query: Tensor, key: Tensor | None = None, *, key_mask: Tensor | None = None) -> AttentionOutput:
        """query (B, L, D), key (B, S, D), key_mask (B, S) -> :class:`AttentionOutput` with output
        (B, L, D) (the weights over the k projected positions are not returned)."""
        q, k, v = self.heads(query, key)
        S = k.shape[2]
        if S > self.max_len:
            raise ValueError(f"key length S={S} exceeds max_len={self.max_len}")
        E, F = self.key_length_proj[:, :S], self.value_length_proj[:, :S]
        if key_mask is not None:
            keep = key_mask[:, None, :, None].to(k.dtype)
            k, v = k * keep, v * keep
        k, v = E @ k, F @ v  # (B, H, k, E): length S projected to k
        return AttentionOutput(output=self.out_proj(merge_heads(attention(q, k, v).output)))
