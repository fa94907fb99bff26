"""The old home of a hybrid's decoding memory, kept one release: it is :mod:`attnkit.cost` now."""

import warnings

from .cost.hybrid import *  # noqa: F403
from .cost.hybrid import __all__  # noqa: F401

warnings.warn("attnkit.hybrid_cost is now part of attnkit.cost (the same names); the old module goes in the next "
              "release", FutureWarning, stacklevel=2)
