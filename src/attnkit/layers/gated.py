r"""Two later refinements of multi-head attention, each a layer of its own answering the same attention
strategies (no cache, KV caches) as :class:`~attnkit.layers.MultiHeadAttention`:

- :class:`GatedAttention`, Qwen3-Next's output gate (Qiu et al. 2025, "Gated Attention for Large Language
  Models"): the query projection also gives a gate per head and dimension, and each head's output is
  multiplied by its sigmoid before the output projection,

      [q_h ; g_h] = x W_Q,h,   o_h = Attention(q_h, K, V) * sigmoid(g_h);

  with Qwen3-Next's per-head query and key norms (RMSNorm with a zero-centred weight, 1 + w) and partial
  rotary embeddings.
- :class:`DifferentialAttention` (Ye et al. 2024, "Differential Transformer"; DiffLlama): heads h and
  h + H/2 form a pair whose softmax maps are subtracted, cancelling the attention noise they share,

      o_h = (softmax(q_h k_h^T s) - lambda softmax(q_h' k_h'^T s)) [v_a ; v_b],
      lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init,   lambda_init = 0.8 - 0.6 exp(-0.3 l),

  each pair's output normalised (RMSNorm over its 2E values) and scaled by 1 - lambda_init. The two maps
  share one attention call: the values are doubled ([v_a ; v_b] as one value head of 2E), so every
  backend and cache runs it as it is.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..functional.checks import check_int
from ..functional.heads import merge_heads, split_heads
from ..functional.precision import accumulation_dtype
from .calls import project
from .multihead import MultiHeadAttention

__all__ = ["GatedAttention", "DifferentialAttention", "ZeroCentredRMSNorm"]


class ZeroCentredRMSNorm(nn.Module):
    """RMSNorm whose weight is stored as w - 1 (initialised at 0): x / rms(x) * (1 + w), computed in float32
    (Qwen3-Next's ``Qwen3NextRMSNorm``)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float() if x.dtype != torch.float64 else x
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.to(normed.dtype))).type_as(x)


class GatedAttention(MultiHeadAttention):
    """Multi-head attention with a sigmoid output gate per head and dimension (module docstring), and,
    as Qwen3-Next has them, zero-centred RMSNorms on each head's query and key (``qk_norm=True``).

    Takes :class:`~attnkit.layers.MultiHeadAttention`'s arguments, plus ``qk_norm`` and ``norm_eps``. For
    partial rotary embeddings give a ``RotaryEmbedding(head_dim, rotary_dim=...)``. Parameters: ``q_proj``
    (D -> H 2E: each head's query then its gate), ``k_proj``, ``v_proj``, ``out_proj``, ``q_norm`` and
    ``k_norm`` (E each)."""

    def __init__(self, *args, qk_norm: bool = True, norm_eps: float = 1e-6, **kwargs):
        super().__init__(*args, **kwargs)
        E, H = self.head_dim, self.num_heads
        self.q_proj = nn.Linear(self.d_model, 2 * H * E, bias=self.q_proj.bias is not None)
        self.q_norm = ZeroCentredRMSNorm(E, norm_eps) if qk_norm else None
        self.k_norm = ZeroCentredRMSNorm(E, norm_eps) if qk_norm else None

    def queries(self, query: Tensor) -> tuple[Tensor, Tensor]:
        """Queries (B, H, L, E) and the gate (B, L, H E), each head's [query ; gate] split from q_proj."""
        B, L, _ = query.shape
        both = project(self.q_proj, query).view(B, L, self.num_heads, 2 * self.head_dim)
        q, gate = both.chunk(2, dim=-1)  # (B, L, H, E) each
        if self.q_norm is not None:
            q = self.q_norm(q)
        return q.transpose(1, 2), gate.reshape(B, L, self.num_heads * self.head_dim)

    def project_kv(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        k = project(self.k_proj, key)
        if self.k_norm is not None:
            B, S, _ = k.shape
            k = self.k_norm(k.view(B, S, self.num_kv_heads, self.head_dim)).view(B, S, self.num_kv_heads * self.head_dim)
        return split_heads(k, self.num_kv_heads), split_heads(project(self.v_proj, value), self.num_kv_heads)

    def combine(self, heads: Tensor, kept: Tensor | None) -> Tensor:
        assert kept is not None  # queries() keeps the gate
        return merge_heads(heads) * torch.sigmoid(kept)


class DifferentialAttention(MultiHeadAttention):
    """Differential attention (module docstring): H heads in H / 2 differential pairs.

    Takes :class:`~attnkit.layers.MultiHeadAttention`'s arguments (H and the key/value heads even), plus
    ``layer`` (lambda_init = 0.8 - 0.6 exp(-0.3 layer)), ``lambda_std`` (the lambdas' initial spread) and
    ``norm_eps``. Parameters: ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` (as MultiHeadAttention),
    ``lambda_q1``, ``lambda_k1``, ``lambda_q2``, ``lambda_k2`` (E each); the pairs' RMSNorm has no weight.
    Attention dropout is refused (the paper defines none for the difference)."""

    def __init__(self, *args, layer: int = 0, lambda_std: float = 0.1, norm_eps: float = 1e-6, **kwargs):
        super().__init__(*args, **kwargs)
        check_int("layer", layer, 0)
        if self.num_heads % 2 or self.num_kv_heads % 2:
            raise ValueError(f"differential attention pairs heads: num_heads={self.num_heads} and num_kv_heads="
                             f"{self.num_kv_heads} must be even")
        if self.dropout > 0:
            raise ValueError("differential attention has no attention dropout (the paper defines none for the "
                             f"difference of two softmax maps), got dropout={self.dropout}")
        E = self.head_dim
        self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * layer)
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.randn(E) * lambda_std) for _ in range(4))
        self.pair_norm = nn.RMSNorm(2 * E, eps=norm_eps, elementwise_affine=False)

    def project_kv(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Keys as usual; values doubled: key head j reads [v_a ; v_b] (2E), v_a the first half's head
        j mod Hkv/2 and v_b the second half's, so one attention call gives both halves of a pair's value."""
        k, v = super().project_kv(key, value)  # (B, Hkv, S, E)
        first, second = v.chunk(2, dim=1)
        return k, torch.cat([first.repeat(1, 2, 1, 1), second.repeat(1, 2, 1, 1)], dim=-1)  # (B, Hkv, S, 2E)

    def lambda_full(self, dtype: torch.dtype) -> Tensor:
        """lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init: the exponents in float32 (float64 for a float64
        layer, :func:`~attnkit.functional.precision.accumulation_dtype`), the rest in ``dtype``, as DiffLlama
        computes it (which takes float32 even in a float64 model)."""
        exponent_dtype = accumulation_dtype(self.lambda_q1.dtype)
        first = torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1, dim=-1, dtype=exponent_dtype)).to(dtype)
        second = torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2, dim=-1, dtype=exponent_dtype)).to(dtype)
        return first - second + self.lambda_init

    def combine(self, heads: Tensor, kept: Tensor | None) -> Tensor:
        """(B, H, L, 2E) -> each pair's (first - lambda second), normalised and scaled: (B, L, H E)."""
        first, second = heads.chunk(2, dim=1)  # (B, H/2, L, 2E): heads h and h + H/2
        difference = first - self.lambda_full(heads.dtype) * second
        return merge_heads((1 - self.lambda_init) * self.pair_norm(difference))
