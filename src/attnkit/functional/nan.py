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
import threading

import torch
from torch import Tensor

from ..errors import InputError
from .heads import repeat_kv
from .tracing import is_compiling, transformed

__all__ = ["ENVIRONMENT_VARIABLE", "nan_rule", "on", "poisoned_rows", "guarded", "marked"]

ENVIRONMENT_VARIABLE = "ATTNKIT_NAN_RULE"
"""``1`` turns the rule on for every thread from import on, ``0`` (or unset, or empty) leaves it off."""


def _from_environment() -> bool:
    value = os.environ.get(ENVIRONMENT_VARIABLE, "")
    if value not in ("", "0", "1"):
        raise InputError(f"{ENVIRONMENT_VARIABLE}={value!r}: expected 1 (the NaN rule on), 0 or empty (off)")
    return value == "1"


class _State(threading.local):
    """The rule's setting in this thread; every thread starts from the environment variable (:data:`_default`)."""

    def __init__(self) -> None:
        self.on = _default


_default = _from_environment()
_state = _State()
_traced = _default
"""The setting a ``torch.compile`` trace reads: the last one made in any thread. TorchDynamo guards module globals
but not a ``threading.local`` (it would fold the tracing thread's value into the graph for every thread), so a
compiled function follows the setting last made; in one thread that is the thread's own."""


class nan_rule:
    """Turn the NaN rule on (``True``) or off (``False``, the default) in the calling thread. Like
    ``torch.set_grad_enabled``, a call and a context manager that restores the thread's previous setting on exit::

        attnkit.nan_rule(True)            # from here on, in this thread
        with attnkit.nan_rule(True):      # within the block only
            ...

    The setting is per thread, as grad mode is: every thread starts from ``ATTNKIT_NAN_RULE`` (off when unset).
    With the rule on, NaN propagates by one rule in every backend (:mod:`attnkit.functional.nan`), at the cost of
    reading q, k and v once more and a ``where`` over the output. ``torch.compile`` reads the setting when it
    traces (a change recompiles); as TorchDynamo guards no thread-local value, a compiled function follows the
    setting last made in any thread: threads that call one compiled function with different settings share its
    graphs."""

    def __init__(self, enabled: bool):
        if not isinstance(enabled, bool):
            raise TypeError(f"nan_rule(enabled) takes True or False, got {type(enabled).__name__} {enabled!r}")
        global _traced
        self.enabled = enabled
        self.previous, _state.on = _state.on, enabled
        _traced = enabled

    def __enter__(self) -> nan_rule:
        return self

    def __exit__(self, *exc) -> None:
        global _traced
        _state.on = _traced = self.previous

    def __repr__(self) -> str:
        return f"nan_rule({self.enabled})"


def on() -> bool:
    """Whether the rule applies now in this thread (:class:`nan_rule`); while ``torch.compile`` traces, the setting
    last made in any thread (what TorchDynamo guards)."""
    return _traced if is_compiling() else _state.on


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


def guarded(q: Tensor, k: Tensor, v: Tensor, groups: int) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """The rule's first half: q, k and v with every NaN replaced by 0, and the rows the rule poisons
    (:func:`poisoned_rows`; None where q has no head dim, and then q, k and v as they are). The call runs on the
    NaN-free inputs and :func:`marked` sets its poisoned rows to NaN: a poisoned row's gradient is zero (the
    ``where`` passes none to it, and none reaches a NaN entry of q, k or v), where a kernel's backward would spread
    NaN from one row to the whole key/value head (dS = P (dP - D) with D = rowsum(dO O) = 0 x NaN). A call that
    computes no gradient (no input requires one, or grad mode is off) keeps q, k and v as they are: a NaN there
    reaches only rows the rule poisons (a query row, or every row of its key/value head), so the rows the rule
    leaves are the same."""
    poisoned = poisoned_rows(q, k, v, groups)
    if poisoned is None:
        return q, k, v, None
    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)) and not transformed():
        return q, k, v, poisoned  # no gradient to keep finite: a NaN reaches no row the rule leaves (three passes fewer)
    return _without_nan(q), _without_nan(k), _without_nan(v), poisoned


def _without_nan(x: Tensor) -> Tensor:
    return torch.where(torch.isnan(x), 0.0, x)  # (its gradient: none at a NaN entry, as it is elsewhere)


def marked(poisoned: Tensor | None, output: Tensor, lse: Tensor | None, weights: Tensor | None,
           heads: list[int] | None) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The rule's second half: ``output`` (B, H, L, Ev), ``lse`` (B, H, L) and ``weights`` (of query ``heads``) of a
    call on :func:`guarded`'s inputs, with the ``poisoned`` rows (B, H, L, 1) set to NaN."""
    if poisoned is None:
        return output, lse, weights
    output = torch.where(poisoned, math.nan, output)
    lse = None if lse is None else torch.where(poisoned[..., 0], math.nan, lse)
    if weights is not None:
        weights = torch.where(poisoned if heads == list(range(poisoned.shape[1])) else poisoned[:, heads], math.nan,
                              weights)
    return output, lse, weights
