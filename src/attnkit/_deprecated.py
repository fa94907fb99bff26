"""Old names kept for one release: :func:`renamed` resolves an argument passed under its old name
(with a ``FutureWarning`` that names the new one), :func:`alias` keeps an old function name.
The glossary of current names is in docs/semantics.md."""

from __future__ import annotations

import functools
import warnings

__all__ = ["renamed", "alias", "UNSET"]


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET = _Unset()
"""Default of a deprecated keyword: tells "not passed" from any value, None included."""


def renamed(where: str, old: str, new: str, old_value, new_value, default):
    """The value of ``new`` when the caller may still pass ``old`` (deprecated): passing both is an
    error, passing only ``old`` warns and is honoured, passing neither gives ``default``."""
    if old_value is UNSET:
        return default if new_value is UNSET else new_value
    if new_value is not UNSET:
        raise TypeError(f"{where}: pass {new}= only ({old}= is its deprecated old name)")
    warnings.warn(f"{where}: {old}= is deprecated, use {new}= (same meaning); the old name goes in the next release",
                  FutureWarning, stacklevel=3)
    return old_value


def alias(function, old: str):
    """``function`` under its deprecated old name ``old``: calling it warns and names the new one."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        warnings.warn(f"{old} is deprecated, use {function.__name__} (same meaning); the old name goes in the next "
                      "release", FutureWarning, stacklevel=2)
        return function(*args, **kwargs)

    wrapper.__name__ = wrapper.__qualname__ = old
    return wrapper
