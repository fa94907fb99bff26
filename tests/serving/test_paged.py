"""Attention over pages equals contiguous attention: a layer's keys written into scattered blocks (random block
tables, several rows of other lengths in one batch, right-aligned with a key mask) give, for every row, what the
layer gives that row alone through a KVCache; also for a sliding window, GQA and every backend, and in float64 to
the last bit where the computation is the same."""

from __future__ import annotations

import random

import pytest
import torch

import attnkit
from attnkit.layers import KVCache, RotaryEmbedding
from attnkit.serving.paged import GroupStep, LayerStorage, PagedKVCache


def _layer(backend: str = "auto") -> attnkit.MultiHeadAttention:
    torch.manual_seed(0)
    layer = attnkit.MultiHeadAttention(32, 4, num_kv_heads=2, rotary=RotaryEmbedding(8), backend=backend)
    return layer.double().eval()


def _tables(lengths, block_size, num_blocks, seed):
    """A block table per row covering its length, from block ids shuffled over the whole pool."""
    ids = list(range(num_blocks))
    random.Random(seed).shuffle(ids)
    tables = []
    for length in lengths:
        need = -(-length // block_size)
        tables.append([ids.pop() for _ in range(need)])
    return tables


@pytest.mark.parametrize("backend", ["auto", "reference", "sdpa", "tiled"])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_a_batched_step_over_scattered_pages_equals_each_row_alone(backend, window, block_size):
    layer = _layer(backend)
    cached = [13, 1, 30, 7]  # positions each row has in the cache before the step
    new = 1
    g = torch.Generator().manual_seed(1)
    x = [torch.randn(1, c + new, 32, generator=g, dtype=torch.float64) for c in cached]
    storage = LayerStorage(num_blocks=64, block_size=block_size)
    tables = _tables([c + new for c in cached], block_size, 64, seed=block_size)
    with torch.no_grad():
        for row, c in enumerate(cached):  # each row's prefix, in a step of its own
            step = GroupStep.build([tables[row]], [0], c, block_size, window, torch.device("cpu"))
            layer(x[row][:, :c], is_causal=True, cache=PagedKVCache(storage, step), window=window,
                  positions=torch.arange(c)[None])
        step = GroupStep.build(tables, cached, new, block_size, window, torch.device("cpu"))
        assert step.by_block and step.width % block_size == 0  # whole blocks, each row's padding in its key mask
        queries = torch.cat([x[row][:, c:] for row, c in enumerate(cached)])
        positions = torch.tensor([[c] for c in cached])
        got = layer(queries, is_causal=True, cache=PagedKVCache(storage, step), window=window,
                    positions=positions).output
        for row, c in enumerate(cached):
            cache = KVCache(window=window)
            layer(x[row][:, :c], is_causal=True, cache=cache, window=window)
            want = layer(x[row][:, c:], is_causal=True, cache=cache, window=window).output
            torch.testing.assert_close(got[row:row + 1], want, rtol=1e-12, atol=1e-12)


def test_a_prefill_chunk_after_cached_pages_equals_a_kv_cache_bit_for_bit():
    """One row (no padding): the same keys, the same call, the same numbers."""
    layer = _layer()
    x = torch.randn(1, 29, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    storage = LayerStorage(num_blocks=16, block_size=4)
    table = _tables([29], 4, 16, seed=3)[0]
    cache = KVCache()
    with torch.no_grad():
        for start, stop in ((0, 11), (11, 12), (12, 29)):
            step = GroupStep.build([table], [start], stop - start, 4, None, torch.device("cpu"))
            got = layer(x[:, start:stop], is_causal=True, cache=PagedKVCache(storage, step),
                        positions=torch.arange(start, stop)[None]).output
            want = layer(x[:, start:stop], is_causal=True, cache=cache).output
            assert torch.equal(got, want)


def test_the_storage_grows_as_blocks_are_first_used_and_holds_finite_padding():
    storage = LayerStorage(num_blocks=100, block_size=2)
    keys = torch.randn(1, 2, 1, 8)
    storage.write(keys, keys, torch.tensor([0]), blocks=1)
    assert storage.capacity == 4 and storage.bytes_per_block() == 2 * 2 * 2 * 8 * 4
    storage.write(keys, keys, torch.tensor([2 * 37]), blocks=38)
    assert storage.capacity == 38 and bool(storage.keys.isfinite().all())
    torch.testing.assert_close(storage.gather(torch.tensor([[0, 74]]), 1)[0][0, :, 1], keys[0, :, 0])
