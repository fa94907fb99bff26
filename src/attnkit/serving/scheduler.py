"""Requests and the scheduler: which tokens of which requests a step computes (vLLM's v1 scheduler, in small).

A request has its tokens (the prompt, then what it generated) and a count of them the caches already hold
(``computed``); a step computes some of the rest. There is no prefill or decode phase: under one token budget a step
first takes the running requests in the order they were admitted (a decoding request one token, a prefilling one as
many of its tokens as the budget leaves: chunked prefill), then admits waiting requests while the budget, the
blocks and the state slots allow. A waiting request's prompt may start with blocks another request computed (a
prefix hit: :mod:`.blocks`). When a running request needs a block and none is free, the last admitted request is
preempted by recompute: its blocks and slot are freed, its count of computed tokens goes back to 0, and it waits at
the front of the queue with every token it has (its prompt and what it generated), recomputed when readmitted.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .blocks import BlockPool, PoolExhausted, block_hash
from .states import SlotPool

__all__ = ["SamplingParams", "Request", "CacheGroup", "Scheduler"]


@dataclass(frozen=True)
class SamplingParams:
    """How a request's tokens are chosen and when it stops (:meth:`attnkit.serving.Engine.add_request`)."""

    max_new_tokens: int
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop_tokens: frozenset[int] = frozenset()


@dataclass(eq=False)
class Request:
    """One request's tokens and what it holds (block tables per cache group, a state slot)."""

    id: int
    tokens: list[int]
    prompt_length: int
    params: SamplingParams
    salt: str | None = None
    generator: torch.Generator | None = None
    computed: int = 0
    tables: dict = field(default_factory=dict)  # cache group's window (None: full) -> block ids (None: freed)
    hashes: list[bytes] = field(default_factory=list)  # the prefix hashes of its first full blocks, in order
    slot: int | None = None
    status: str = "waiting"  # "waiting", "running" or "finished"
    finish_reason: str | None = None  # "stop", "length" or "cancelled"
    logprobs: list[float] = field(default_factory=list)
    cancelled: bool = False

    @property
    def pending(self) -> int:
        """Tokens the caches do not hold yet."""
        return len(self.tokens) - self.computed

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_length:]


@dataclass
class CacheGroup:
    """The layers of one window (None: full attention) and their pool of blocks."""

    window: int | None
    pool: BlockPool

    def blocks_for(self, end: int, block_size: int) -> int:
        """Logical blocks a request of ``end`` positions spans."""
        return math.ceil(end / block_size)

    def most_blocks(self, positions: int, block_size: int, chunk: int) -> int:
        """The most blocks a request of ``positions`` positions holds at once, computing at most ``chunk`` tokens
        a step (a window group's are capped: the window and the step's tokens, and the blocks they straddle)."""
        if self.window is None:
            return math.ceil(positions / block_size)
        return min(math.ceil(positions / block_size), math.ceil((self.window + chunk) / block_size) + 1)


class Scheduler:
    """Waiting and running requests, the cache groups' pools and the state slots (module docstring)."""

    def __init__(self, groups: Sequence[CacheGroup], slots: SlotPool | None, *, block_size: int,
                 max_batched_tokens: int, max_num_seqs: int, prefix_caching: bool) -> None:
        self.groups, self.slots = list(groups), slots
        self.block_size, self.max_batched_tokens, self.max_num_seqs = block_size, max_batched_tokens, max_num_seqs
        self.prefix_caching = prefix_caching
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.preemptions = 0

    # -- one step's plan ------------------------------------------------------------------------------------
    def schedule(self) -> list[tuple[Request, int]]:
        """(request, tokens to compute) for this step, within the token budget; running requests first."""
        budget, plan = self.max_batched_tokens, []
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            count = min(request.pending, budget)
            if not self._reserve(request, request.computed + count):
                break  # the request preempted itself: nothing after it runs either
            plan.append((request, count))
            budget -= count
            index += 1
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            if self.slots is not None and not self.slots.free:
                break
            hits = self._hit(request)
            count = min(request.pending, budget)
            if not self._grow(request, request.computed + count):
                self._free(request)  # (its hits back: no running request is preempted for a waiting one)
                request.computed = 0
                break
            self.waiting.popleft()
            request.status = "running"
            if self.slots is not None:
                request.slot = self.slots.take()
            self.running.append(request)
            plan.append((request, count))
            budget -= count
            if hits:
                self.groups[0].pool.hit_tokens += hits
        return plan

    def _reserve(self, request: Request, end: int) -> bool:
        """Blocks for ``end`` positions, preempting the last admitted requests while none is free; False where
        ``request`` itself had to go."""
        while not self._grow(request, end):
            victim = self.running[-1]
            self.preempt(victim)
            if victim is request:
                return False
        return True

    def _grow(self, request: Request, end: int) -> bool:
        """Take the blocks ``request`` lacks for ``end`` positions in every group; all or none."""
        taken: list[tuple[CacheGroup, int]] = []
        try:
            for group in self.groups:
                table = request.tables.setdefault(group.window, [])
                while len(table) < group.blocks_for(end, self.block_size):
                    table.append(group.pool.take())
                    taken.append((group, table[-1]))
        except PoolExhausted:
            for group, block in reversed(taken):
                request.tables[group.window].pop()
                group.pool.release([block])
            return False
        return True

    def _hit(self, request: Request) -> int:
        """Hold the blocks another request computed for this one's first full blocks (a new or preempted request;
        at least its last token left to compute, in a block of its own); the tokens hit."""
        if not self.prefix_caching or request.computed or not self.groups:
            return 0
        group = self.groups[0]  # (prefix caching is on only where every group is full attention: one group)
        table = request.tables.setdefault(group.window, [])
        size, parent = self.block_size, None
        for index in range((len(request.tokens) - 1) // size):
            tokens = request.tokens[index * size:(index + 1) * size]
            hash_ = block_hash(parent, tokens, request.salt)
            block = group.pool.lookup(hash_, tokens, request.salt)
            if block is None:
                break
            group.pool.hold(block)
            table.append(block)
            request.hashes.append(hash_)
            parent = hash_
        request.computed = len(table) * size
        return request.computed

    # -- after a step ---------------------------------------------------------------------------------------
    def computed(self, request: Request, count: int) -> None:
        """``count`` more of ``request``'s tokens are in the caches: its full blocks hashed (prefix caching), a
        window group's blocks that left the window freed."""
        request.computed += count
        size = self.block_size
        if self.prefix_caching and self.groups:
            group = self.groups[0]
            table = request.tables[group.window]
            for index in range(len(request.hashes), request.computed // size):
                tokens = request.tokens[index * size:(index + 1) * size]
                hash_ = block_hash(request.hashes[-1] if request.hashes else None, tokens, request.salt)
                group.pool.register(table[index], hash_, tokens, request.salt)
                request.hashes.append(hash_)
        for group in self.groups:
            if group.window is None:
                continue
            table = request.tables.get(group.window, [])
            for index in range(min(len(table), (request.computed - group.window) // size)):  # needed: > computed - W
                if table[index] is not None:
                    group.pool.release([table[index]])
                    table[index] = None

    def finish(self, request: Request, reason: str) -> None:
        """``request`` is done: its blocks and slot freed."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self._free(request)
        request.status, request.finish_reason = "finished", reason

    def preempt(self, request: Request) -> None:
        """Free everything ``request`` holds and put it first in the queue, to be recomputed."""
        self.running.remove(request)
        self._free(request)
        request.computed, request.status = 0, "waiting"
        self.waiting.appendleft(request)
        self.preemptions += 1

    def _free(self, request: Request) -> None:
        for group in self.groups:
            table = request.tables.pop(group.window, [])
            group.pool.release([block for block in table if block is not None])
        request.hashes = []
        if request.slot is not None and self.slots is not None:
            self.slots.release(request.slot)
        request.slot = None
