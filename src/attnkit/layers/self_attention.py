"""Single-head self attention: the smallest scaled dot-product attention layer."""

from __future__ import annotations

from torch import Tensor, nn

from .._deprecated import UNSET, renamed
from ..functional import attention
from ..functional.attention import AttentionOutput
from ..functional.checks import check_rank

__all__ = ["SelfAttention"]


class SelfAttention(nn.Module):
    """softmax(X W_Q (X W_K)^T / sqrt(E)) X W_V over (B, L, D) inputs, one head, no output projection.

    Args:
        d_model: D, input feature size.
        head_dim: E, the size of queries, keys and values (default D; ``d_k`` is its deprecated old
            name).
        bias: bias in the three projections.
        backend: attention backend, see :func:`attnkit.attention`.
    """

    def __init__(self, d_model: int, head_dim=UNSET, *, bias: bool = False, backend: str = "auto",
                 d_k=UNSET):
        super().__init__()
        head_dim = renamed("SelfAttention", "d_k", "head_dim", d_k, head_dim, None)
        self.d_model = d_model
        self.head_dim = d_model if head_dim is None else head_dim
        self.backend = backend
        self.q_proj = nn.Linear(d_model, self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, self.head_dim, bias=bias)

    def forward(
        self, x: Tensor, *, mask: Tensor | None = None, is_causal: bool = False, need_weights: bool = False
    ) -> AttentionOutput:
        """x (B, L, D) -> output (B, L, E), weights (B, L, L) if asked for.

        ``mask`` is boolean (L, L) or (B, 1, 1|L, L), True = may attend.
        """
        check_rank("x", x, 3, "(B, L, D)")
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x must have last dim d_model={self.d_model}, got shape {tuple(x.shape)}")
        q, k, v = (proj(x)[:, None] for proj in (self.q_proj, self.k_proj, self.v_proj))  # (B, 1, L, E)
        result = attention(
            q, k, v, mask=mask, is_causal=is_causal, backend=self.backend, need_weights=need_weights
        )
        weights = None if result.weights is None else result.weights[:, 0]
        lse = None if result.lse is None else result.lse[:, 0]
        return AttentionOutput(output=result.output[:, 0], weights=weights, lse=lse)
