"""Alias of :mod:`attnkit.functional.masks` so that ``import attnkit.masks`` works."""

from .functional.masks import *  # noqa: F401,F403
from .functional.masks import __all__  # noqa: F401
