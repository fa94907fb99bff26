"""``attnkit.masks``: every mask in one place, :mod:`attnkit.functional.masks` (boolean masks,
mask_mods, :class:`BlockMask`) and :mod:`attnkit.functional.block_patterns` (the named patterns'
block masks in closed form, :func:`pattern_block_mask`)."""

from .functional.block_patterns import *  # noqa: F401,F403
from .functional.block_patterns import __all__ as _patterns
from .functional.masks import *  # noqa: F401,F403
from .functional.masks import __all__ as _masks

__all__ = [*_masks, *_patterns]
