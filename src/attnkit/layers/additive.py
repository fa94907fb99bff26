"""Additive attention (Bahdanau, Cho and Bengio 2014, "Neural Machine Translation by Jointly
Learning to Align and Translate", eq. 6):

    e_ij = v_a^T tanh(W_a s_{i-1} + U_a h_j),   a_ij = softmax_j(e_ij),   c_i = sum_j a_ij h_j
"""

from __future__ import annotations

from torch import Tensor, nn

from .._deprecated import UNSET
from ..functional import attend, scores
from ..functional.attention import AttentionOutput
from ..functional.checks import check_rank
from ._alignment import alignment_inputs, current_names, finish

__all__ = ["BahdanauAttention"]


class BahdanauAttention(nn.Module):
    """Bahdanau (additive) attention for an RNN decoder.

    Args:
        query_dim: Dq, size of the decoder state s_{i-1}.
        key_dim: Dk, size of the encoder annotations h_j.
        attn_dim: A, size of the hidden layer of the alignment MLP.
        bias: biases in W_a and U_a (the paper has none).

    Parameters: ``query_proj`` (W_a: Dq -> A), ``key_proj`` (U_a: Dk -> A), ``score_proj`` (v_a: A -> 1).

    U_a h_j does not depend on the decoder step: compute it once per source sentence with
    :meth:`project_keys` and pass it as ``projected_keys`` at every step.
    """

    def __init__(self, query_dim: int, key_dim: int, attn_dim: int, *, bias: bool = False):
        super().__init__()
        self.query_dim = query_dim
        self.key_dim = key_dim
        self.attn_dim = attn_dim
        self.query_proj = nn.Linear(query_dim, attn_dim, bias=bias)
        self.key_proj = nn.Linear(key_dim, attn_dim, bias=bias)
        self.score_proj = nn.Linear(attn_dim, 1, bias=False)

    def project_keys(self, keys: Tensor) -> Tensor:
        """U_a h_j for keys (B, S, Dk) -> (B, S, A); reuse it across decoding steps."""
        check_rank("keys", keys, 3, "(B, S, Dk)")
        if keys.shape[-1] != self.key_dim:
            raise ValueError(f"keys must have last dim {self.key_dim}, got shape {tuple(keys.shape)}")
        return self.key_proj(keys)

    def forward(
        self,
        query: Tensor,
        key=UNSET,
        value=UNSET,
        key_mask=UNSET,
        *,
        projected_keys: Tensor | None = None,
        temperature: float = 1.0,
        keys=UNSET,
        values=UNSET,
        mask=UNSET,
    ) -> AttentionOutput:
        """Attend from decoder state(s) to the encoder annotations.

        Args:
            query: (B, Dq) one decoder step, or (B, L, Dq) several.
            key: (B, S, Dk) encoder annotations. value: (B, S, Dv), default ``key``.
            key_mask: (B, S) boolean, True at real keys (not source padding).
            projected_keys: (B, S, A) from :meth:`project_keys`, to skip recomputing U_a h_j.
            temperature: divides the scores before the softmax.
            keys, values, mask: the deprecated old names of ``key``, ``value``, ``key_mask``.

        Returns:
            :class:`~attnkit.AttentionOutput`: output = the context (B, Dv) and weights (B, S) for one
            step; (B, L, Dv) and (B, L, S) for several; lse None.
        """
        key, value, key_mask = current_names("BahdanauAttention", key, value, key_mask, keys, values, mask)
        keys, values, mask = key, value, key_mask
        inputs = alignment_inputs(query, keys, values, mask, self.query_dim, self.key_dim)
        if projected_keys is None:
            projected_keys = self.key_proj(inputs.keys)
        elif tuple(projected_keys.shape) != (*keys.shape[:2], self.attn_dim):
            raise ValueError(
                f"projected_keys must have shape (B, S, A) = {(*keys.shape[:2], self.attn_dim)}, "
                f"got {tuple(projected_keys.shape)}"
            )
        energy = scores.additive(self.query_proj(inputs.query), projected_keys, v=self.score_proj.weight[0])
        context, weights = attend(energy, inputs.values, mask=inputs.mask, temperature=temperature)
        return finish(context, weights, inputs.single_step)
