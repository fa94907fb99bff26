"""Attention backends. Each is ``forward(q, k, v, problem) -> BackendResult`` and gives the same
numbers; :func:`attnkit.functional.attention` is the only caller."""

from . import flex, reference, sdpa, tiled

BACKENDS = {
    "reference": reference.forward,
    "sdpa": sdpa.forward,
    "tiled": tiled.forward,
    "flex": flex.forward,
}

__all__ = ["BACKENDS"]
