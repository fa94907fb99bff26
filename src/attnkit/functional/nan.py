"""The NaN rule (docs/semantics.md), a check the user turns on, as PyTorch's ``detect_anomaly`` is.

By default :func:`attnkit.attention` returns what its backend returns: nothing reads q, k, v or the output for
NaN, and nothing waits for the device. Fused kernels differ in what a NaN does there (SDPA's CPU kernels drop a
NaN query under a vector's width of keys; a NaN in a masked key may spread or not).

With the rule on (:func:`nan_rule`, or ``ATTNKIT_NAN_RULE=1`` in the environment), NaN propagates one way in every
backend: a NaN in query row i makes that row's output, weights and lse NaN; a NaN anywhere in the keys or values
of a (batch, key/value head) makes every row of the query heads reading it NaN, whatever the mask says. It is
the simplest exact form, with no look on the host: per-row maxima of q, k and v and one ``where`` over the
output, the same kernels on every device, compiled, exported and under torch.func transforms.
"""

from __future__ import annotations

import math
import os

import torch
from torch import Tensor

from ..errors import InputError
from .checks import Dims
from .heads import repeat_kv

__all__ = ["ENVIRONMENT_VARIABLE", "nan_rule", "on", "poisoned_rows", "applied", "with_nan_rows"]

ENVIRONMENT_VARIABLE = "ATTNKIT_NAN_RULE"
"""``1`` turns the rule on for the process from import on, ``0`` (or unset, or empty) leaves it off."""


def _from_environment() -> bool:
    value = os.environ.get(ENVIRONMENT_VARIABLE, "").strip()
    if value not in ("", "0", "1"):
        raise InputError(f"{ENVIRONMENT_VARIABLE}={value!r}: expected 1 (the NaN rule on), 0 or empty (off)")
    return value == "1"


_on = _from_environment()


class nan_rule:
    """Turn the NaN rule on (``True``) or off (``False``, the default): a global switch, and a context manager
    that restores the previous setting on exit, as ``torch.set_grad_enabled`` is both::

        attnkit.nan_rule(True)            # from here on, in every thread
        with attnkit.nan_rule(True):      # within the block only
            ...

    With the rule on, NaN propagates by one rule in every backend (:mod:`attnkit.functional.nan`), at the cost of
    reading q, k and v once more and a ``where`` over the output. ``torch.compile`` reads the setting at trace time
    (a change recompiles)."""

    def __init__(self, enabled: bool):
        if not isinstance(enabled, bool):
            raise TypeError(f"nan_rule(enabled) takes True or False, got {type(enabled).__name__} {enabled!r}")
        global _on
        self.enabled = enabled
        self.previous, _on = _on, enabled

    def __enter__(self) -> nan_rule:
        return self

    def __exit__(self, *exc) -> None:
        global _on
        _on = self.previous

    def __repr__(self) -> str:
        return f"nan_rule({self.enabled})"


def on() -> bool:
    """Whether the rule applies now (:class:`nan_rule`)."""
    return _on


def poisoned_rows(q: Tensor, k: Tensor, v: Tensor, groups: int) -> Tensor | None:
    """(B, H, L, 1) True where the rule makes a row NaN (``groups`` = H // Hkv consecutive query heads read one
    key/value head), or None where q has no head dim. No host read: maxima propagate NaN and never overflow."""
    if q.shape[-1] == 0:
        return None
    q_max = q.amax(dim=-1, keepdim=True)  # (B, H, L, 1)
    kv_max = None  # (B, Hkv, 1, 1): torch.maximum propagates NaN over the keys and the values
    for x in (k, v):
        if x.numel():
            m = x.amax(dim=(2, 3), keepdim=True)
            kv_max = m if kv_max is None else torch.maximum(kv_max, m)
    if kv_max is None:
        return torch.isnan(q_max)
    return torch.isnan(torch.maximum(q_max, repeat_kv(kv_max, groups)))


def applied(q: Tensor, k: Tensor, v: Tensor, dims: Dims, output: Tensor, lse: Tensor | None, weights: Tensor | None,
            heads: list[int] | None) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """``output`` (B, H, L, Ev), ``lse`` (B, H, L) and ``weights`` (of query ``heads``) as the backend returned
    them, or, with the rule on, with the rows it poisons set to NaN: what :func:`attnkit.attention` and
    :func:`attnkit.functional.topk.topk_attention` do after any backend."""
    if not _on:
        return output, lse, weights
    poisoned = poisoned_rows(q, k, v, dims.groups)
    if poisoned is None:
        return output, lse, weights
    output = torch.where(poisoned, math.nan, output)
    lse = None if lse is None else torch.where(poisoned[..., 0], math.nan, lse)
    if weights is not None:
        weights = torch.where(poisoned if heads == list(range(dims.H)) else poisoned[:, heads], math.nan, weights)
    return output, lse, weights


def with_nan_rows(q: Tensor, k: Tensor, v: Tensor, dims: Dims, output: Tensor) -> Tensor:
    """:func:`applied` for an output alone: as the backend returned it, or with the rule's rows where it is on."""
    return applied(q, k, v, dims, output, None, None, None)[0]
