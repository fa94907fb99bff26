"""State slots: a linear or Mamba-2 layer's cache (the recurrent state and the convolution's tail) for many requests,
one slot per live request, the batched twin of :class:`~attnkit.layers.LinearStateCache`.

Per layer two tensors of (slots, ...) rows, allocated at the first write (their shapes are the layer's). For a step
the rows of the step's requests are gathered into a :class:`~attnkit.layers.LinearStateCache` of that batch, which
the layer reads and replaces as it always does, and scattered back after. A request's slot is the same in every
layer; a new request's rows are cleared (None: the layer starts from zeros).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..layers import LinearStateCache

__all__ = ["SlotPool", "LayerStates"]


class SlotPool:
    """``num_slots`` slots, each held by at most one live request."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.free = list(range(num_slots))[::-1]  # (taken from the end: slot 0 first)

    @property
    def in_use(self) -> int:
        return self.num_slots - len(self.free)

    def take(self) -> int | None:
        return self.free.pop() if self.free else None

    def release(self, slot: int) -> None:
        if slot in self.free or not 0 <= slot < self.num_slots:
            raise RuntimeError(f"slot {slot} released twice or never taken")
        self.free.append(slot)


class LayerStates:
    """One layer's slots: ``conv`` (slots, channels, kernel - 1) and ``state`` (slots, H, K, V); a layer without a
    convolution (MiniMax's lightning attention) keeps the state alone."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.conv: Tensor | None = None
        self.state: Tensor | None = None

    def cache_for(self, slots: Sequence[int], fresh: bool, device: torch.device) -> LinearStateCache:
        """A :class:`~attnkit.layers.LinearStateCache` of the step's rows (``slots``, in order); ``fresh``: the
        rows start from nothing (a new request's first tokens: the layer's own zeros)."""
        cache = LinearStateCache()
        if not fresh:
            index = torch.tensor(list(slots), dtype=torch.long, device=device)
            cache.conv = None if self.conv is None else self.conv.index_select(0, index)
            cache.state = None if self.state is None else self.state.index_select(0, index)
        return cache

    def keep(self, cache: LinearStateCache, slots: Sequence[int]) -> None:
        """Write the rows of a step's cache back into ``slots``."""
        index = None
        for name in ("conv", "state"):
            rows = getattr(cache, name)
            if rows is None:
                continue
            held = getattr(self, name)
            if held is None:
                held = rows.new_zeros(self.num_slots, *rows.shape[1:])
                setattr(self, name, held)
            if index is None:
                index = torch.tensor(list(slots), dtype=torch.long, device=rows.device)
            held.index_copy_(0, index, rows.to(held.dtype))

    def bytes_per_slot(self) -> int:
        return sum(x[0].numel() * x.element_size() for x in (self.conv, self.state) if x is not None)
