"""What attnkit keeps beside a tensor for the layers of one model call, and never longer.

A model hands every layer the same key mask and the same positions; what the layers derive from them (the
mask as (B, 1, 1, S), whether a row has no allowed key, the rotary tables) is computed by the first layer
and kept for the others. It is kept for **one call** of the outermost model (:func:`one_call`, entered by
the models' ``forward``) and nowhere else: a tensor rewritten between calls, by any means (an in-place op,
``.data``, a NumPy array sharing its memory), is read afresh by the next call, and nothing depends on a
version counter (inference tensors have none). Outside a model call nothing is kept. Each thread has its
own call.

    with kept.one_call():                      # a model's forward
        keys = kept.get(key_mask, "keys", lambda: key_mask.bool().reshape(B, 1, 1, S))
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Any, TypeVar

import torch
from torch import Tensor

__all__ = ["one_call", "per_call", "get", "active"]

T = TypeVar("T")
_ATTRIBUTE = "_attnkit_kept"


class _State(threading.local):
    depth = 0
    held: list[Tensor]

    def __init__(self) -> None:
        self.held = []


_state = _State()


@contextlib.contextmanager
def one_call() -> Iterator[None]:
    """Within the block (the outermost one, for nested models), :func:`get` keeps what it builds beside its
    tensor; on leaving it, everything kept is dropped."""
    _state.depth += 1
    try:
        yield
    finally:
        _state.depth -= 1
        if _state.depth == 0:
            for tensor in _state.held:
                tensor.__dict__.pop(_ATTRIBUTE, None)
            _state.held.clear()


def per_call(forward: Callable[..., T]) -> Callable[..., T]:
    """A model's ``forward`` run inside :func:`one_call` (left as it is while compiling: a compiled graph
    keeps nothing between its layers this way)."""
    @functools.wraps(forward)
    def within_one_call(*args: Any, **kwargs: Any) -> T:
        if torch.compiler.is_compiling():
            return forward(*args, **kwargs)
        with one_call():
            return forward(*args, **kwargs)

    return within_one_call


def active() -> bool:
    """Whether a model call is under way in this thread (what :func:`get` builds is then kept)."""
    return _state.depth > 0


def get(tensor: Tensor, key: Hashable, build: Callable[[], T]) -> T:
    """``build()``, kept beside ``tensor`` under ``key`` for the rest of this model call; built every time
    outside a model call and while compiling (a graph has no tensor to keep it on)."""
    if _state.depth == 0 or torch.compiler.is_compiling():
        return build()
    store: dict[Any, Any] | None = tensor.__dict__.get(_ATTRIBUTE)
    if store is None:
        store = {}
        tensor.__dict__[_ATTRIBUTE] = store
        _state.held.append(tensor)
    elif key in store:
        return store[key]
    value = store[key] = build()
    return value
