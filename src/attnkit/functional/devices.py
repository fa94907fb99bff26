"""A device's type without building a string on every read.

``torch.device.type`` makes its string through a C++ stream each time it is read: a third of a microsecond
alone, 4.6 us inside a layer call, where that code has gone cold
(``benchmarks/results/overhead_ab_2026-11-27_tenth/in_context_before.txt``). A tensor's own flags
(``x.is_cpu``, ``x.is_cuda``) are cheaper still and are what the hot paths read; this is for the places that hold
a ``torch.device``.
"""

from __future__ import annotations

import torch

__all__ = ["device_type"]

_TYPES: dict[torch.device, str] = {}


def device_type(device: torch.device) -> str:
    """``device.type`` ("cpu", "cuda", ...), read once per device and kept (a device hashes and compares without
    building a string)."""
    try:
        return _TYPES[device]
    except KeyError:
        kind = _TYPES[device] = device.type
        return kind
