"""Errors shared across attnkit: :class:`InputError`, the base of every error that means "what the
caller supplied cannot be used" (a checkpoint, a run folder, a model config, a command's
arguments), as opposed to a bug in attnkit. The ``attnkit`` command prints these on one line and
exits with status 2; any other exception keeps its traceback."""

from __future__ import annotations

__all__ = ["InputError"]


class InputError(ValueError):
    """What the caller supplied (a file, a config, an argument) cannot be used; the message names it."""
