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

from ..functional.attention import AttentionOutput
from ..layers import KVCache, LatentCache
from ..layers.attending import AttentionCall

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

    def gather_blocks(self, blocks: Tensor) -> tuple[Tensor, Tensor]:
        """The keys and values of whole blocks (B, NB), each row's blocks side by side: (B, heads, NB x
        block_size, .)."""
        assert self.keys is not None and self.values is not None
        B, NB = blocks.shape
        flat = blocks.reshape(-1)
        out = []
        for storage in (self.keys, self.values):  # whole contiguous blocks, as rows of a 2-D view (torch's fast path:
            rows = storage.view(storage.shape[0], storage[0].numel()).index_select(0, flat)  # a 4-D one: 3.5x longer)
            out.append(rows.view(B, NB * self.block_size, *storage.shape[2:]).transpose(1, 2))
        return out[0], out[1]

    def gather(self, slots: Tensor, B: int) -> tuple[Tensor, Tensor]:
        """The keys and values at ``slots`` (B, S): (B, heads, S, width) and (B, heads, S, value width)."""
        assert self.keys is not None and self.values is not None
        S = slots.shape[1]
        flat = slots.reshape(-1)
        out = []
        for storage in (self.keys, self.values):  # (rows of a 2-D view: torch's fast path)
            rows = storage.view(storage.shape[0] * storage.shape[1], storage.shape[2] * storage.shape[3])
            rows = rows.index_select(0, flat)  # (B S, heads width)
            out.append(rows.view(B, S, *storage.shape[2:]).transpose(1, 2))
        return out[0], out[1]


@dataclass(frozen=True)
class GroupStep:
    """What a step's rows hold in one cache group, shared by the group's layers: where the new tokens go
    (``write_slots``, (B L,)), which keys each row attends and how they are laid out (``read_slots`` or
    ``read_blocks``), which of those columns are its own (``key_mask`` (B, S), None for one row), the positions
    taken so far (``position``: the largest row's) and the blocks the storage must hold (``blocks``).

    Two layouts:

    - **by slot** (one row, any number of new tokens: a prefill chunk): the row's keys one by one, in order, the new
      ones last, attended causally (aligned bottom-right) and, in a window group, through the window; exactly what
      a :class:`~attnkit.layers.KVCache` hands its attention;
    - **by block** (several rows of one new token each: a decoding step): whole blocks gathered (a block is one
      contiguous row of the storage: a fraction of the copies one slot at a time takes), each row's blocks from the
      left, its keys marked in ``key_mask``: those of its positions that it attends (in a window group the last
      ``window``), neither the padding after its blocks nor the unwritten end of its last block. A single query
      needs no causal mask."""

    write_slots: Tensor
    read_slots: Tensor | None
    read_blocks: Tensor | None
    key_mask: Tensor | None
    position: int
    blocks: int
    window: int | None

    @staticmethod
    def build(tables: Sequence[Sequence[int | None]], computed: Sequence[int], new: int, block_size: int,
              window: int | None, device: torch.device) -> GroupStep:
        """The step of rows whose block tables are ``tables``, with ``computed`` positions already in the cache and
        ``new`` more each. (Tensor arithmetic over the rows' positions: a batch of long requests would otherwise
        cost a Python loop over every position of every row.)"""
        done = torch.tensor(list(computed), dtype=torch.long)  # (B,)
        end = done + new
        blocks = 1 + max(b for t in tables for b in t if b is not None)
        width = max(len(table) for table in tables)
        table = torch.tensor([[0 if b is None else b for b in t] + [0] * (width - len(t)) for t in tables],
                             dtype=torch.long)  # (B, blocks); a freed block (out of the window) is never read
        new_positions = done[:, None] + torch.arange(new)  # (B, L)
        write = table.gather(1, new_positions // block_size) * block_size + new_positions % block_size
        if new == 1 and len(tables) > 1:  # by block
            first = torch.zeros_like(done) if window is None else (end - window).clamp(min=0)  # (a query sees W keys)
            first_block, last_block = first // block_size, (end - 1) // block_size
            count = last_block - first_block + 1
            columns = torch.arange(int(count.max()))
            index = (first_block[:, None] + columns).clamp(max=width - 1)
            read_blocks = torch.where(columns < count[:, None], table.gather(1, index), 0)  # (B, NB)
            positions = first_block[:, None] * block_size + torch.arange(read_blocks.shape[1] * block_size)
            key_mask = (positions >= first[:, None]) & (positions < end[:, None])
            return GroupStep(write.reshape(-1).to(device), None, read_blocks.to(device), key_mask.to(device),
                             max(computed), blocks, window)
        first = torch.zeros_like(done) if window is None else (done - window).clamp(min=0)  # (as a rolling cache holds)
        S = int((end - first).max())
        positions = end[:, None] - S + torch.arange(S)  # (B, S), right-aligned: the last is each row's newest
        real = positions >= first[:, None]
        positions = positions.clamp(min=0)
        slots = torch.where(real, table.gather(1, positions // block_size) * block_size + positions % block_size, 0)
        return GroupStep(write.reshape(-1).to(device), slots.to(device), None,
                         None if len(tables) == 1 else real.to(device), max(computed), blocks, window)

    @property
    def by_block(self) -> bool:
        return self.read_blocks is not None

    @property
    def width(self) -> int:
        """S: the columns every row's attention reads (its own keys and the padding its key mask rules out)."""
        if self.read_blocks is not None:
            assert self.key_mask is not None  # (by block: a column of the mask per key read)
            return self.key_mask.shape[1]
        assert self.read_slots is not None
        return self.read_slots.shape[1]


def _read(storage: LayerStorage, step: GroupStep, B: int) -> tuple[Tensor, Tensor]:
    """The keys and values a step's rows attend, in the step's layout: (B, heads, S, .) each."""
    if step.read_blocks is None:
        assert step.read_slots is not None
        return storage.gather(step.read_slots, B)
    return storage.gather_blocks(step.read_blocks)


class _PagedRows:
    """What a paged cache of either kind does with its rows: the new tokens written into their blocks, the keys the
    step's rows attend read back in its layout."""

    storage: LayerStorage
    step: GroupStep
    position: int

    def attended_length(self, new: int) -> int:
        return self.step.width

    def _append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        self.storage.write(keys, values, self.step.write_slots, self.step.blocks)
        self.position += keys.shape[2]
        return _read(self.storage, self.step, keys.shape[0])


class PagedKVCache(_PagedRows, KVCache):
    """A :class:`~attnkit.layers.KVCache` for one layer and one step whose keys and values live in paged storage: the
    new tokens are written into each row's blocks and the keys each row attends read back in the step's layout
    (:class:`GroupStep`), whose key mask (rather than the model's attention mask, which the engine does not pass)
    rules out the padding. ``window``: a sliding-window layer's (as the rolling cache it stands for)."""

    def __init__(self, storage: LayerStorage, step: GroupStep) -> None:
        super().__init__(window=step.window)
        self.storage, self.step = storage, step
        self.position = step.position

    def attend(self, layer, q: Tensor, key: Tensor, value: Tensor, call: AttentionCall) -> AttentionOutput:
        """The KV cache's own call, with the step's key mask; a step by block carries its window in the mask."""
        return super().attend(layer, q, key, value, call._replace(key_mask=self.step.key_mask))

    def _window_for(self, window: int | None) -> int | None:
        return None if self.step.by_block else super()._window_for(window)


class PagedLatentCache(_PagedRows, LatentCache):
    """A :class:`~attnkit.layers.LatentCache` over paged storage: the latents (as the keys, one head) and the rotary
    keys (as the values) in ``storage``, DSA's indexer keys in ``index_storage``, read back in the step's layout with
    its key mask; everything else is the latent cache's own (``attend_latent``)."""

    def __init__(self, storage: LayerStorage, index_storage: LayerStorage, step: GroupStep) -> None:
        super().__init__()
        self.storage, self.step = storage, step
        self.position = step.position
        self._index = PagedKVCache(index_storage, step)

    def attend_latent(self, layer, q: Tensor, x: Tensor, latent_call) -> AttentionOutput:
        call = latent_call.call._replace(key_mask=self.step.key_mask)
        return super().attend_latent(layer, q, x, latent_call._replace(call=call))
