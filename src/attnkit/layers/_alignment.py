"""Input handling shared by the recurrent-decoder attention layers (Bahdanau, Luong)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .._deprecated import UNSET, renamed
from ..functional.attention import AttentionOutput
from ..functional.checks import check_rank, check_same


class AlignmentInputs(NamedTuple):
    query: Tensor  # (B, L, Dq); L = 1 for a single decoder step
    keys: Tensor  # (B, S, Dk)
    values: Tensor  # (B, S, Dv)
    mask: Tensor | None  # (B, 1, S) boolean, True = may attend
    single_step: bool  # the caller passed query (B, Dq): squeeze L on the way out


def current_names(where: str, key, value, key_mask, keys, values, mask) -> tuple:
    """(key, value, key_mask) from the layers' arguments, their old names ``keys``, ``values`` and
    ``mask`` (a (B, S) key mask) honoured with a FutureWarning for one release."""
    key = renamed(where, "keys", "key", keys, key, UNSET)
    if key is UNSET:
        raise TypeError(f"{where}: key (B, S, Dk) is required")
    return (key, renamed(where, "values", "value", values, value, None),
            renamed(where, "mask", "key_mask", mask, key_mask, None))


def alignment_inputs(
    query: Tensor, keys: Tensor, values: Tensor | None, mask: Tensor | None, query_dim: int, key_dim: int
) -> AlignmentInputs:
    """Validate query (B, Dq) or (B, L, Dq), keys (B, S, Dk), values (B, S, Dv), key mask (B, S)."""
    if not isinstance(query, Tensor) or query.dim() not in (2, 3):
        shape = tuple(query.shape) if isinstance(query, Tensor) else type(query).__name__
        raise ValueError(f"query must have shape (B, Dq) or (B, L, Dq), got {shape}")
    check_rank("key", keys, 3, "(B, S, Dk)")
    values = keys if values is None else values
    check_rank("value", values, 3, "(B, S, Dv)")
    check_same("query", query, key=keys, value=values)
    single_step = query.dim() == 2
    query = query[:, None] if single_step else query
    B, S = keys.shape[:2]
    if query.shape[-1] != query_dim:
        raise ValueError(f"query must have last dim {query_dim}, got shape {tuple(query.shape)}")
    if keys.shape[-1] != key_dim:
        raise ValueError(f"key must have last dim {key_dim}, got shape {tuple(keys.shape)}")
    if query.shape[0] != B or values.shape[:2] != (B, S):
        raise ValueError(
            f"query {tuple(query.shape)}, key {tuple(keys.shape)} and value {tuple(values.shape)} "
            "must share batch size B, and key and value length S"
        )
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            raise TypeError(f"key_mask must be a boolean tensor (True = a real key), got {getattr(mask, 'dtype', mask)}")
        if tuple(mask.shape) != (B, S):
            raise ValueError(f"key_mask must have shape (B, S) = ({B}, {S}), got {tuple(mask.shape)}")
        mask = mask[:, None, :]
    return AlignmentInputs(query, keys, values, mask, single_step)


def finish(context: Tensor, weights: Tensor, single_step: bool) -> AttentionOutput:
    """The layers' result, as :class:`~attnkit.AttentionOutput` (output = the context); the L dim
    is dropped again when the caller passed a single query step."""
    if single_step:
        return AttentionOutput(context[:, 0], weights[:, 0])
    return AttentionOutput(context, weights)
