"""torch's FlexAttention ``BlockMask`` and attnkit's :class:`~attnkit.functional.block_mask.BlockMask`, both ways.

This module stands above both the mask type and the flex backend whose tables it reads: the mask type knows
nothing of torch's, and the backend nothing of the conversion.

- :func:`from_torch`: an attnkit mask that means what torch's ``mask`` means to ``flex_attention`` (its
  tiles from ``kv_indices`` / ``full_kv_indices`` at its own ``BLOCK_SIZE``, its ``mask_mod`` on the partial
  ones), converted once per torch mask and kept beside it;
- :func:`to_torch`: this mask for torch's ``flex_attention`` unchanged (128 x 128 tiles);
- :func:`as_block_mask`: what :func:`attnkit.attention` does with a ``mask=``: a torch mask converted,
  anything else as it is.
"""

from __future__ import annotations

from torch import Tensor

from .backends import flex_tables
from .backends.flex import _lookup, flex_block_mask
from .block_mask import BlockMask
from .tracing import may_keep

__all__ = ["from_torch", "to_torch", "as_block_mask", "is_torch_block_mask"]


def is_torch_block_mask(obj) -> bool:
    """Whether ``obj`` is ``torch.nn.attention.flex_attention.BlockMask`` (told by its class, so that
    telling needs no import of FlexAttention)."""
    cls = type(obj)
    return cls.__name__ == "BlockMask" and cls.__module__.startswith("torch.nn.attention")


def from_torch(mask) -> BlockMask:
    """An attnkit block mask that means what ``torch.nn.attention.flex_attention.BlockMask`` ``mask`` means
    to ``flex_attention``: its tiles (partial ones from ``kv_indices``, full ones from ``full_kv_indices``,
    every other tile empty) at its own ``BLOCK_SIZE``, and its ``mask_mod`` on the partial tiles. Converted
    once per torch mask (kept beside it); any :func:`attnkit.attention` backend then gives flex_attention's
    numbers. :func:`to_torch` of the result is ``mask`` itself."""
    if not is_torch_block_mask(mask):
        raise TypeError(f"mask must be a torch.nn.attention.flex_attention.BlockMask, got {type(mask).__name__}")
    found = getattr(mask, "_attnkit_block_mask", None)
    if found is not None and found[0] is mask.kv_indices:  # converted before, from these tables
        return found[1]
    kinds = flex_tables.kinds_from_torch(mask)
    block_size = flex_tables._pair(mask.BLOCK_SIZE)
    L, S = (int(n) for n in mask.seq_lengths)
    mod = flex_tables.tiled_mask_mod(kinds, block_size, mask.mask_mod)
    result = BlockMask(kinds, (kinds.shape[0], kinds.shape[1], L, S), block_size, mask_mod=mod)
    result._torch = mask
    if may_keep(kinds.device):  # kept on the torch mask: every layer converts once (a fake one never)
        mask._attnkit_block_mask = (mask.kv_indices, result)
    return result


def to_torch(mask: BlockMask):
    """``mask`` as ``torch.nn.attention.flex_attention.BlockMask``, for torch's ``flex_attention`` unchanged:
    128 x 128 tiles (torch's kernels' size; reclassified where this mask's tiles do not divide 128) with its
    mask_mod (or its dense tensor looked up) on the partial ones, indices clamped to the lengths. A mask made
    by :func:`from_torch` gives back the torch mask it came from."""
    if not isinstance(mask, BlockMask):
        raise TypeError(f"mask must be an attnkit BlockMask, got {type(mask).__name__}")
    if mask._torch is not None:
        return mask._torch
    _, _, L, S = mask.shape
    mod = mask.mask_mod if mask._dense is None else _lookup(mask._dense)
    return flex_block_mask(flex_tables.tile_kinds(mask), (L, S), flex_tables.clamped_mask_mod(mod, L, S))


def as_block_mask(mask):
    """``mask`` as :func:`attnkit.attention` takes it: torch's flex_attention BlockMask converted by
    :func:`from_torch`, anything else unchanged (checked where it is used)."""
    if mask is None or isinstance(mask, (Tensor, BlockMask)):
        return mask
    return from_torch(mask) if is_torch_block_mask(mask) else mask
