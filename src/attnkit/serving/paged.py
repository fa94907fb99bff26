"""Paged storage for many requests' caches, and the per-step cache objects the model is handed.

A model's layers keep three kinds of cache (``model.new_cache()`` says which layer keeps which):

- **keys and values** (:class:`~attnkit.layers.KVCache`, rolling for a sliding-window layer): per token and layer
  (Hkv, E) keys and (Hkv, Ev) values;
- **latents** (:class:`~attnkit.layers.LatentCache`, DeepSeek's and Kimi's multi-head latent attention): per token
  the latent and the rotary key (and DSA's indexer key), nothing per head;
- **a state** (:class:`~attnkit.layers.LinearStateCache`, the linear and Mamba-2 layers): per request the
  recurrent state and the convolution's tail, whatever the length.

The first two are paged: per layer a tensor of (blocks, block_size, heads, width) rows (:class:`LayerStorage`),
grown as blocks are first used, and per request a block table (logical block -> block id) shared by the layers of
a **cache group** (the layers of one window: full attention, or a sliding window of W, whose blocks that leave the
window are freed). The state is one slot per live request (:mod:`.states`).

For a step the engine builds, per layer, the same kind of cache the model's own ``new_cache`` gives, over the
step's rows (:class:`PagedKVCache`, :class:`PagedLatentCache`, and the state caches of :mod:`.states`): each
answers the layer's one call (``attend``) as a KV cache does, writing the new tokens' keys into their requests'
blocks and attending over the keys gathered from the blocks, the rows of a batch right-aligned (left-padded) with
a key mask, so the layers and models gain no serving branch (docs/serving.md). A first path, exact for every
backend and mask attnkit's attention takes; it gathers each row's keys once per layer and step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..layers import KVCache, LatentCache

__all__ = ["LayerStorage", "GroupStep", "PagedKVCache", "PagedLatentCache"]


class LayerStorage:
    """One layer's paged rows: ``keys`` (blocks, block_size, heads, width) and ``values`` (blocks, block_size, heads,
    value width), allocated at the first write (their shapes and dtype are the layer's), zero-filled (a key the mask
    rules out is still multiplied by 0: it must hold a finite number), grown by doubling up to ``num_blocks``."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.keys: Tensor | None = None
        self.values: Tensor | None = None

    @property
    def capacity(self) -> int:
        """Blocks the tensors hold now."""
        return 0 if self.keys is None else self.keys.shape[0]

    def bytes_per_block(self) -> int:
        """Bytes one block takes in this layer (0 before the first write)."""
        if self.keys is None or self.values is None:
            return 0
        return (self.keys[0].numel() * self.keys.element_size() + self.values[0].numel() * self.values.element_size())

    def ensure(self, keys: Tensor, values: Tensor, blocks: int) -> None:
        """Room for block ids below ``blocks``, in the layout of a write of ``keys`` (B, heads, L, width) and
        ``values`` (B, heads, L, value width)."""
        if self.keys is not None and self.values is not None and blocks <= self.keys.shape[0]:
            return
        grown = min(self.num_blocks, max(blocks, 2 * self.capacity, 4))
        shape = (grown, self.block_size)
        new_keys = keys.new_zeros(*shape, keys.shape[1], keys.shape[3])
        new_values = values.new_zeros(*shape, values.shape[1], values.shape[3])
        if self.keys is not None and self.values is not None:
            new_keys[:self.capacity] = self.keys
            new_values[:self.capacity] = self.values
        self.keys, self.values = new_keys, new_values

    def write(self, keys: Tensor, values: Tensor, slots: Tensor, blocks: int) -> None:
        """Write the (B, heads, L, .) keys and values of a step's new tokens at ``slots`` (B * L,) (block id x
        block_size + offset, row by row)."""
        self.ensure(keys, values, blocks)
        assert self.keys is not None and self.values is not None
        for storage, new in ((self.keys, keys), (self.values, values)):
            if storage.numel():  # (DSA's indexer keys are stored with values of width 0)
                flat = storage.flatten(0, 1)  # (blocks block_size, heads, width): a view
                flat.index_copy_(0, slots, new.transpose(1, 2).reshape(-1, *flat.shape[1:]).to(flat.dtype))

    def gather(self, slots: Tensor, B: int) -> tuple[Tensor, Tensor]:
        """The keys and values at ``slots`` (B, S): (B, heads, S, width) and (B, heads, S, value width)."""
        assert self.keys is not None and self.values is not None
        S = slots.shape[1]
        flat = slots.reshape(-1)
        keys = self.keys.flatten(0, 1).index_select(0, flat)  # (B S, heads, width)
        values = self.values.flatten(0, 1).index_select(0, flat)
        return (keys.unflatten(0, (B, S)).transpose(1, 2), values.unflatten(0, (B, S)).transpose(1, 2))


@dataclass(frozen=True)
class GroupStep:
    """What a step's rows hold in one cache group, shared by the group's layers: where the new tokens go
    (``write_slots``, (B L,)), which keys each row attends, right-aligned in S columns (``read_slots`` (B, S), the
    pad columns pointing at slot 0, which the key mask rules out), each row's count of keys (``lengths``), the
    positions taken so far (``position``: the largest row's), and the blocks the storage must hold
    (``blocks``)."""

    write_slots: Tensor
    read_slots: Tensor
    lengths: tuple[int, ...]
    position: int
    blocks: int
    window: int | None

    @staticmethod
    def build(tables: Sequence[Sequence[int | None]], computed: Sequence[int], new: int, block_size: int,
              window: int | None, device: torch.device) -> GroupStep:
        """The step of rows whose block tables are ``tables``, with ``computed`` positions already in the cache and
        ``new`` more each. A window group's rows read their last ``window`` cached positions (a rolling cache
        holds as many) and the new ones; a full group's read all. (Tensor arithmetic over the rows' positions:
        a batch of long requests would otherwise cost a Python loop over every position of every row.)"""
        done = torch.tensor(list(computed), dtype=torch.long)  # (B,)
        first = torch.zeros_like(done) if window is None else (done - window).clamp(min=0)
        end = done + new
        lengths = end - first
        S = int(lengths.max())
        width = max(len(table) for table in tables)
        table = torch.tensor([[0 if b is None else b for b in t] + [0] * (width - len(t)) for t in tables],
                             dtype=torch.long)  # (B, blocks); a freed block (out of the window) is never read
        positions = end[:, None] - S + torch.arange(S)  # (B, S), right-aligned: the last is each row's newest
        real = positions >= first[:, None]
        positions = positions.clamp(min=0)
        slots = table.gather(1, positions // block_size) * block_size + positions % block_size
        slots = torch.where(real, slots, 0)
        blocks = 1 + max(b for t in tables for b in t if b is not None)
        return GroupStep(slots[:, S - new:].reshape(-1).to(device), slots.to(device), tuple(lengths.tolist()),
                         max(computed), blocks, window)

    @property
    def width(self) -> int:
        """S: the keys every row's attention reads (its own right-aligned, the rest padding)."""
        return self.read_slots.shape[1]


class PagedKVCache(KVCache):
    """A :class:`~attnkit.layers.KVCache` for one layer and one step whose keys and values live in paged storage: its
    ``attend`` is the KV cache's own, and appending writes the new tokens into each row's blocks and hands back the
    keys each row attends (the group's, right-aligned, padded on the left: the model's attention mask rules the
    padding out). ``window``: a sliding-window layer's (as the rolling cache it stands for)."""

    def __init__(self, storage: LayerStorage, step: GroupStep) -> None:
        super().__init__(window=step.window)
        self.storage, self.step = storage, step
        self.position = step.position

    def attended_length(self, new: int) -> int:
        return self.step.width

    def _append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        self.storage.write(keys, values, self.step.write_slots, self.step.blocks)
        self.position += keys.shape[2]
        return self.storage.gather(self.step.read_slots, keys.shape[0])


class PagedLatentCache(LatentCache):
    """A :class:`~attnkit.layers.LatentCache` over paged storage: the latents (as the keys, one head) and the rotary
    keys (as the values) in ``storage``, DSA's indexer keys in ``index_storage``; everything else is the latent
    cache's own (``attend_latent``)."""

    def __init__(self, storage: LayerStorage, index_storage: LayerStorage, step: GroupStep) -> None:
        super().__init__()
        self.storage, self.step = storage, step
        self.position = step.position
        self._index = PagedKVCache(index_storage, step)

    def attended_length(self, new: int) -> int:
        return self.step.width

    def _append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        self.storage.write(keys, values, self.step.write_slots, self.step.blocks)
        self.position += keys.shape[2]
        return self.storage.gather(self.step.read_slots, keys.shape[0])
