"""``attnkit.masks``: the public home of masks, True = may attend everywhere.

- boolean masks for :func:`attnkit.attention`: :func:`causal`, :func:`sliding_window`, :func:`padding`,
  :func:`local`, :func:`causal_positions`, combined with :func:`and_masks` / :func:`or_masks`, and
  converted from other conventions with :func:`from_key_padding_mask` and :func:`from_additive`;
  a sparse attention's top-k selection of keys or key blocks as a mask with :func:`selected`;
- sparse patterns as FlexAttention's ``mask_mod(b, h, q_idx, kv_idx)`` (the ``*_mod`` functions),
  turned into a :class:`BlockMask` by :func:`block_mask`, or built in closed form by the
  ``*_block_mask`` builders; :data:`PATTERNS` and :func:`pattern_block_mask` by name;
- torch's FlexAttention ``BlockMask`` and attnkit's, both ways: :func:`from_torch_block_mask`,
  :func:`to_torch_block_mask` (a torch mask is also taken as it is by every ``mask=``).

The code lives in :mod:`attnkit.functional.masks`, :mod:`attnkit.functional.mask_mods`,
:mod:`attnkit.functional.block_mask` and :mod:`attnkit.functional.block_patterns`; what is not listed
in ``__all__`` (internal helpers such as ``causal_offset``, deprecated aliases such as ``and_mods``)
is still reachable as an attribute but is not part of the public surface.
"""

from .functional.block_patterns import (
    band_kinds,  # noqa: F401  # internal: the tiled and flex backends' band tiles
    causal_block_mask,
    document_block_mask,
    document_ids,
    longformer_block_mask,
    pattern_block_mask,
    prefix_lm_block_mask,
    sinks_block_mask,
    window_block_mask,
)
from .functional.masks import (
    ALIGNMENTS,
    PATTERNS,
    BlockMask,
    MaskMod,
    ScoreMod,
    and_masks,
    and_mods,  # noqa: F401  # deprecated alias of and_masks, one release
    bigbird_mod,
    block_mask,
    causal,
    causal_block,  # noqa: F401  # internal: one block of the causal mask (backends)
    causal_mod,
    causal_offset,  # noqa: F401  # internal: the key index query 0 is aligned with
    causal_positions,
    dilated_window_mod,
    document_mod,
    from_additive,
    from_key_padding_mask,
    local,
    longformer_mod,
    or_masks,
    or_mods,  # noqa: F401  # deprecated alias of or_masks, one release
    padding,
    padding_mod,
    prefix_lm_mod,
    real_tokens_mod,
    selected,
    sinks_window_mod,
    sliding_window,
    window_mod,
)
from .functional.torch_block_mask import from_torch as from_torch_block_mask
from .functional.torch_block_mask import to_torch as to_torch_block_mask

__all__ = [
    # boolean masks
    "causal", "sliding_window", "padding", "local", "causal_positions", "and_masks", "or_masks",
    "from_key_padding_mask", "from_additive", "selected", "ALIGNMENTS",
    # block masks and the mask_mod vocabulary
    "BlockMask", "MaskMod", "ScoreMod", "block_mask", "causal_mod", "padding_mod", "real_tokens_mod", "window_mod",
    "longformer_mod", "bigbird_mod", "prefix_lm_mod", "document_mod", "dilated_window_mod", "sinks_window_mod",
    # named patterns, in closed form
    "PATTERNS", "pattern_block_mask", "causal_block_mask", "window_block_mask", "longformer_block_mask",
    "document_block_mask", "document_ids", "prefix_lm_block_mask", "sinks_block_mask",
    # torch's FlexAttention BlockMask, both ways
    "from_torch_block_mask", "to_torch_block_mask",
]
