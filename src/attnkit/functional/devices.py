"""A device's type without building a string on every read, and a call run as SDPA runs under autocast.

``torch.device.type`` makes its string through a C++ stream each time it is read: a third of a microsecond
alone, 4.6 us inside a layer call, where that code has gone cold
(``benchmarks/overhead.py``). A tensor's own flags
(``x.is_cpu``, ``x.is_cuda``) are cheaper still and are what the hot paths read; this is for the places that hold
a ``torch.device``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["device_type", "under_autocast"]

_TYPES: dict[torch.device, str] = {}


def device_type(device: torch.device) -> str:
    """``device.type`` ("cpu", "cuda", ...), read once per device and kept (a device hashes and compares without
    building a string)."""
    try:
        return _TYPES[device]
    except KeyError:
        kind = _TYPES[device] = device.type
        return kind


def under_autocast(function: Callable, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, options: dict):
    """``function`` under ``torch.autocast`` as PyTorch's SDPA runs there: where autocast is on for q's
    device, q, k, v and a float bias of any dtype but float64 are cast to its dtype (the casts autocast
    applies to SDPA's inputs, differentiable back to the float32 originals), and the call itself runs
    with autocast off, so that the backends keep their float32 accumulation."""
    device = q.device.type
    if not torch.is_autocast_enabled(device):
        with torch.autocast(device, enabled=False):  # on for another device only: leave the call alone
            return function(q, k, v, bias=bias, **options)
    dtype = torch.get_autocast_dtype(device)

    def cast(x):
        return x.to(dtype) if isinstance(x, Tensor) and x.is_floating_point() and x.dtype != torch.float64 else x

    with torch.autocast(device, enabled=False):
        return function(cast(q), cast(k), cast(v), bias=cast(bias), **options)
