"""Alias of :mod:`attnkit.functional.scores` so that ``import attnkit.scores`` works."""

from .functional.scores import *  # noqa: F401,F403
from .functional.scores import __all__  # noqa: F401
