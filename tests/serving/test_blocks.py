"""The block pool on its own: the free queue's order, reference counts, prefix hashes checked against their tokens,
evictions, and the bookkeeping check every randomized engine test ends with."""

from __future__ import annotations

import pytest

from attnkit.serving import BlockPool, block_hash
from attnkit.serving.blocks import PoolExhausted


def test_blocks_are_taken_least_recently_freed_first_and_a_request_returns_its_tail_first():
    pool = BlockPool(4)
    first = [pool.take() for _ in range(3)]
    assert first == [0, 1, 2] and pool.in_use == 3
    pool.release(first)  # a request's blocks, head first: the tail goes back first, so it is taken first
    assert list(pool.free) == [3, 2, 1, 0]
    assert pool.take() == 3 and pool.take() == 2
    pool.check()


def test_a_shared_block_is_held_once_and_freed_when_its_last_holder_lets_go():
    pool = BlockPool(2)
    block = pool.take()
    pool.register(block, block_hash(None, [1, 2], None), [1, 2], None)
    pool.hold(block)  # a second request hits it
    assert pool.in_use == 1 and pool.blocks[block].ref_count == 2
    pool.release([block])
    assert pool.in_use == 1
    pool.release([block])
    assert pool.in_use == 0 and pool.cached_free == 1  # free, and still hit-able
    with pytest.raises(RuntimeError, match="released more often than taken"):
        pool.release([block])
    pool.check()


def test_a_freed_prefix_stays_hit_able_until_its_block_is_taken_again():
    pool = BlockPool(1)
    block = pool.take()
    hash_ = block_hash(None, [5, 6, 7], None)
    assert pool.register(block, hash_, [5, 6, 7], None)
    pool.release([block])
    assert pool.lookup(hash_, [5, 6, 7], None) == block
    pool.hold(block)
    pool.release([block])
    assert pool.take() == block and pool.evictions == 1  # taken for another use: evicted
    assert pool.lookup(hash_, [5, 6, 7], None) is None and pool.num_cached == 0
    with pytest.raises(PoolExhausted):
        pool.take()


def test_a_hit_is_checked_against_the_blocks_tokens_and_salt():
    """Two different blocks forced to one hash: a miss, not the other block's keys."""
    pool = BlockPool(2)
    block = pool.take()
    pool.register(block, b"forced", [1, 2, 3], None)
    assert pool.lookup(b"forced", [1, 2, 3], None) == block
    assert pool.lookup(b"forced", [1, 2, 4], None) is None
    assert pool.lookup(b"forced", [1, 2, 3], "tenant-b") is None
    assert not pool.register(pool.take(), b"forced", [1, 2, 4], None)  # the first holder of a hash keeps it


def test_hashes_chain_over_the_blocks_before_and_the_salt():
    first = block_hash(None, [1, 2], None)
    assert block_hash(first, [3, 4], None) != block_hash(block_hash(None, [9, 9], None), [3, 4], None)
    assert block_hash(None, [1, 2], "a") != block_hash(None, [1, 2], "b") != block_hash(None, [1, 2], None)
    assert block_hash(None, [12, 3], None) != block_hash(None, [1, 23], None)


def test_without_prefix_caching_nothing_is_kept_or_hit():
    pool = BlockPool(2, prefix_caching=False)
    block = pool.take()
    assert not pool.register(block, b"h", [1], None) and pool.lookup(b"h", [1], None) is None


@pytest.mark.parametrize("blocks", [0, -1, 1.5, True])
def test_a_pool_needs_a_positive_int_of_blocks(blocks):
    with pytest.raises(ValueError, match="num_blocks must be an int >= 1"):
        BlockPool(blocks)
