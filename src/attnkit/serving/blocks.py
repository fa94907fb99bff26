"""The pool of fixed-size KV blocks every request's cache is made of (Kwon et al. 2023, PagedAttention).

A block holds ``block_size`` consecutive token positions of one request (of every layer of a cache group: the
storage lives in :mod:`.paged`; a block id indexes it). The pool keeps:

- a **free queue** in least-recently-freed order: a block is taken from its front and returned to its back. A
  request's blocks return tail first, so that its prefix, the part most likely shared, is evicted last;
- a **reference count** per block: a block shared by several requests (a common prefix) is held once and counted
  once, and returns to the free queue when its count falls to 0;
- **prefix hashes** (vLLM's prefix caching): a full block computed from known tokens gets a hash chained over the
  blocks before it (hash(parent's hash, its token ids, the request's salt)); a later request whose prompt has
  the same chain takes the block instead of computing it. A hit is checked against the block's own token ids and
  salt (two blocks with the same hash are told apart), and a freed block keeps its hash while it waits in the free
  queue: it can be hit until it is taken for another use, an eviction;
- **counters** as data: blocks in use, cached, prefix hits (in tokens), evictions.

Like nano-vllm's ``block_manager.py`` and vLLM's ``v1/core/block_pool.py``, small and explicit.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Block", "BlockPool", "block_hash", "PoolExhausted"]


class PoolExhausted(RuntimeError):
    """No free block is left (the scheduler preempts a request and tries again)."""


def block_hash(parent: bytes | None, tokens: Sequence[int], salt: str | None) -> bytes:
    """A full block's prefix hash: SHA-256 over its parent's hash, its token ids and the request's salt (a
    per-tenant ``cache_salt``: requests of different salts never share a block)."""
    digest = hashlib.sha256()
    digest.update(parent or b"")
    digest.update(b"|" + ",".join(map(str, tokens)).encode())
    digest.update(b"|" + (salt or "").encode())
    return digest.digest()


@dataclass
class Block:
    """One block: its id (the row of every storage tensor of its group), how many requests hold it, and, once it is
    full and hashed, its hash with the token ids and salt it was computed from (what a hit is checked against)."""

    id: int
    ref_count: int = 0
    hash: bytes | None = None
    tokens: tuple[int, ...] = ()
    salt: str | None = None


@dataclass
class BlockPool:
    """``num_blocks`` blocks of one cache group (module docstring). ``prefix_caching`` False: no hash is kept,
    nothing is hit."""

    num_blocks: int
    prefix_caching: bool = True
    blocks: list[Block] = field(init=False)
    free: OrderedDict[int, None] = field(init=False)  # block id -> None, front = least recently freed
    cached: dict[bytes, int] = field(init=False)  # hash -> block id
    hit_tokens: int = 0  # prefix-cache hits, in tokens
    evictions: int = 0  # hashed blocks taken for another use
    cached_held: int = 0  # hashed blocks some request holds

    def __post_init__(self) -> None:
        if isinstance(self.num_blocks, bool) or not isinstance(self.num_blocks, int) or self.num_blocks < 1:
            raise ValueError(f"num_blocks must be an int >= 1, got {self.num_blocks!r}")
        self.blocks = [Block(i) for i in range(self.num_blocks)]
        self.free = OrderedDict.fromkeys(range(self.num_blocks))
        self.cached = {}

    # -- counts -----------------------------------------------------------------------------------------
    @property
    def in_use(self) -> int:
        """Blocks some request holds (a shared one once)."""
        return self.num_blocks - len(self.free)

    @property
    def cached_free(self) -> int:
        """Free blocks that still hold a hashed prefix (hit-able until evicted)."""
        return len(self.cached) - self.cached_held

    @property
    def num_cached(self) -> int:
        """Blocks that hold a hashed prefix, held or free."""
        return len(self.cached)

    # -- taking and returning ---------------------------------------------------------------------------
    def take(self) -> int:
        """A free block (the least recently freed), its count 1; a hashed one loses its hash (an eviction).
        :class:`PoolExhausted` when none is free."""
        if not self.free:
            raise PoolExhausted(f"all {self.num_blocks} blocks are in use")
        block_id, _ = self.free.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None:
            del self.cached[block.hash]
            block.hash, block.tokens, block.salt = None, (), None
            self.evictions += 1
        block.ref_count = 1
        return block_id

    def hold(self, block_id: int) -> None:
        """One more holder of a hashed block (a prefix hit): out of the free queue if it was there."""
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free[block_id]
            self.cached_held += block.hash is not None
        block.ref_count += 1

    def release(self, block_ids: Sequence[int]) -> None:
        """One holder fewer of each of ``block_ids`` (a request's, head first); those no one holds go back to the
        free queue tail first, keeping their hashes."""
        for block_id in reversed(block_ids):
            block = self.blocks[block_id]
            if block.ref_count <= 0:
                raise RuntimeError(f"block {block_id} released more often than taken")
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free[block_id] = None
                self.cached_held -= block.hash is not None

    # -- prefix caching ----------------------------------------------------------------------------------
    def lookup(self, hash_: bytes, tokens: Sequence[int], salt: str | None) -> int | None:
        """The block that holds this prefix (its hash, and the same tokens and salt), or None."""
        if not self.prefix_caching:
            return None
        block_id = self.cached.get(hash_)
        if block_id is None:
            return None
        block = self.blocks[block_id]
        if block.tokens != tuple(tokens) or block.salt != salt:  # two blocks forced to one hash: a miss
            return None
        return block_id

    def register(self, block_id: int, hash_: bytes, tokens: Sequence[int], salt: str | None) -> bool:
        """Record that ``block_id``, now full, holds this prefix; False (left unhashed) where another block already
        holds it or prefix caching is off."""
        if not self.prefix_caching or hash_ in self.cached:
            return False
        block = self.blocks[block_id]
        block.hash, block.tokens, block.salt = hash_, tuple(tokens), salt
        self.cached[hash_] = block_id
        self.cached_held += block.ref_count > 0
        return True

    def check(self) -> None:
        """Raise unless the bookkeeping is consistent: every block free xor held, counts never negative, the hash
        table and the blocks' hashes the same (what the randomized tests call after every step)."""
        for block in self.blocks:
            if block.ref_count < 0 or (block.ref_count == 0) != (block.id in self.free):
                raise AssertionError(f"block {block.id}: ref_count {block.ref_count}, free {block.id in self.free}")
            if block.hash is not None and self.cached.get(block.hash) != block.id:
                raise AssertionError(f"block {block.id}: its hash is not in the table")
        if any(self.blocks[i].hash != h for h, i in self.cached.items()):
            raise AssertionError("the hash table names a block that holds another hash")
        held = sum(1 for i in self.cached.values() if self.blocks[i].ref_count > 0)
        if held != self.cached_held:
            raise AssertionError(f"{held} hashed blocks are held, the count says {self.cached_held}")
