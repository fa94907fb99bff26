"""Luong attention (Luong, Pham and Manning 2015, "Effective Approaches to Attention-based Neural
Machine Translation").

Scores between the current target state h_t and source states h_s (section 3.1):

    dot:     h_t^T h_s
    general: h_t^T W_a h_s
    concat:  v_a^T tanh(W_a [h_t; h_s])

Global attention attends to every source position. Local attention (section 3.2) attends to a
window [p_t - D, p_t + D]:

    local-m: p_t = t (monotonic alignment);
    local-p: p_t = S sigmoid(v_p^T tanh(W_p h_t)) and the weights are multiplied by
             exp(-(s - p_t)^2 / (2 sigma^2)), sigma = D / 2 (not renormalised).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .._deprecated import UNSET, renamed
from ..functional import attend, masks, scores
from ..functional.attention import AttentionOutput
from ._alignment import alignment_inputs, current_names, finish

__all__ = ["LuongAttention"]

SCORE_NAMES = ("dot", "general", "concat")
MODES = ("global", "local-m", "local-p")


class LuongAttention(nn.Module):
    """Luong attention with a dot, general or concat score, global or local.

    Args:
        dim: size of target and source hidden states.
        score: "dot" | "general" | "concat".
        mode: "global" | "local-m" | "local-p".
        half_width: D, the half-width of the local window [p_t - D, p_t + D] (local modes only;
            ``window`` is its deprecated old name: ``window`` is the causal look-back elsewhere).

    Parameters: ``score_weight`` (W_a, general), ``concat_proj`` and ``score_proj`` (W_a, v_a,
    concat), ``position_proj`` and ``position_score`` (W_p, v_p, local-p).
    """

    def __init__(self, dim: int, score: str = "dot", mode: str = "global", half_width=UNSET, *, window=UNSET):
        super().__init__()
        if score not in SCORE_NAMES:
            raise ValueError(f"score must be one of {SCORE_NAMES}, got {score!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        half_width = renamed("LuongAttention", "window", "half_width", window, half_width, 10)
        if isinstance(half_width, bool) or not isinstance(half_width, int) or half_width < 0:
            raise ValueError(f"half_width must be a non-negative int, got {half_width!r}")
        self.dim = dim
        self.score = score
        self.mode = mode
        self.half_width = half_width
        if score == "general":
            self.score_weight = nn.Linear(dim, dim, bias=False)
        elif score == "concat":
            self.concat_proj = nn.Linear(2 * dim, dim, bias=False)
            self.score_proj = nn.Linear(dim, 1, bias=False)
        if mode == "local-p":
            self.position_proj = nn.Linear(dim, dim, bias=False)
            self.position_score = nn.Linear(dim, 1, bias=False)

    @property
    def window(self) -> int:
        """Deprecated old name of :attr:`half_width` (``window`` is the causal look-back elsewhere)."""
        return renamed("LuongAttention", "window", "half_width", self.half_width, UNSET, None)

    def _scores(self, query: Tensor, keys: Tensor) -> Tensor:
        if self.score == "dot":
            return scores.dot(query, keys)
        if self.score == "general":
            return scores.general(query, keys, weight=self.score_weight.weight)
        return scores.concat(query, keys, weight=self.concat_proj.weight, v=self.score_proj.weight[0])

    def predict_centers(self, query: Tensor, lengths: Tensor) -> Tensor:
        """local-p: p_t = S sigmoid(v_p^T tanh(W_p h_t)) for query (B, L, D), lengths (B,) -> (B, L)."""
        gate = torch.sigmoid(self.position_score(torch.tanh(self.position_proj(query))))[..., 0]
        return lengths[:, None].to(gate.dtype) * gate

    def _centers(self, query: Tensor, mask: Tensor | None, S: int, position, single_step: bool) -> Tensor:
        B, L = query.shape[:2]
        if self.mode == "local-p":
            lengths = torch.full((B,), S, device=query.device) if mask is None else mask[:, 0].sum(-1)
            return self.predict_centers(query, lengths)
        if position is None:
            if single_step:
                raise ValueError("local-m attention of a single step needs position=t (int or (B,) tensor)")
            return torch.arange(L, device=query.device, dtype=query.dtype).expand(B, L)
        position = torch.as_tensor(position, device=query.device, dtype=query.dtype)
        if position.dim() == 0:
            return position.expand(B, L)
        if position.dim() == 1 and position.shape[0] == B and single_step:
            return position[:, None]
        if tuple(position.shape) == (B, L):
            return position
        raise ValueError(f"position must be an int, (B,) for one step, or (B, L) = ({B}, {L}), got {tuple(position.shape)}")

    def forward(
        self,
        query: Tensor,
        key=UNSET,
        value=UNSET,
        key_mask=UNSET,
        *,
        position: int | Tensor | None = None,
        temperature: float = 1.0,
        keys=UNSET,
        values=UNSET,
        mask=UNSET,
    ) -> AttentionOutput:
        """Attend from target state(s) to source states.

        Args:
            query: (B, D) one step h_t, or (B, L, D) several steps.
            key: (B, S, D) source states. value: (B, S, Dv), default ``key``.
            key_mask: (B, S) boolean, True at real keys (not source padding); local-p takes S per
                example from it.
            position: local-m only: the target position t (int, (B,) or (B, L)); with several steps
                it defaults to 0, 1, ..., L-1.
            temperature: divides the scores before the softmax; towards 0 the weights become a
                hard (one-hot) alignment.
            keys, values, mask: the deprecated old names of ``key``, ``value``, ``key_mask``.

        Returns:
            :class:`~attnkit.AttentionOutput`: output = the context (B, Dv) and weights (B, S) for one
            step; (B, L, Dv) and (B, L, S) for several; lse None.
        """
        key, value, key_mask = current_names("LuongAttention", key, value, key_mask, keys, values, mask)
        keys, values, mask = key, value, key_mask
        inputs = alignment_inputs(query, keys, values, mask, self.dim, self.dim)
        energy = self._scores(inputs.query, inputs.keys)  # (B, L, S)
        if self.mode == "global":
            context, weights = attend(energy, inputs.values, mask=inputs.mask, temperature=temperature)
            return finish(context, weights, inputs.single_step)
        S = keys.shape[1]
        centers = self._centers(inputs.query, inputs.mask, S, position, inputs.single_step)  # (B, L)
        allowed = masks.local(inputs.query.shape[1], S, centers, self.half_width)[:, 0]  # (B, L, S)
        if inputs.mask is not None:
            allowed = allowed & inputs.mask
        prior = None
        if self.mode == "local-p":
            sigma = self.half_width / 2
            offsets = torch.arange(S, device=keys.device, dtype=centers.dtype) - centers[..., None]
            prior = torch.exp(-(offsets**2) / (2 * sigma**2)) if sigma > 0 else (offsets == 0).to(centers.dtype)
        context, weights = attend(energy, inputs.values, mask=allowed, temperature=temperature, prior=prior)
        return finish(context, weights, inputs.single_step)
