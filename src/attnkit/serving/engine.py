"""The engine: many requests on one model, a step at a time (continuous batching), and ``generate_many``.

    engine = Engine(model)                          # any of attnkit's decoder-only models, hybrids included
    a = engine.add_request(prompt_ids, max_new_tokens=64)
    while engine.has_unfinished():
        for out in engine.step():                   # one per request that moved
            print(out.request_id, out.new_tokens, out.finished)

Each step the scheduler (:mod:`.scheduler`) picks tokens under the token budget; the engine runs them through the
model: every request that decodes one token in one batched forward (each row's keys gathered from its blocks,
right-aligned, with a key mask), and each prefill chunk in a forward of its own. The caches the model is handed are
the kinds its own ``new_cache`` gives, over paged storage and state slots (:mod:`.paged`, :mod:`.states`), so the
model runs as it does under :func:`attnkit.decoding.generate`. A request alone gets ``generate``'s tokens; among
others, the same tokens whatever else is in the batch, the token budget, the block size or the prefix cache (the
logits to float rounding: docs/serving.md).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .._progress import progress_bar
from ..decoding import sample_next
from ..layers import KVCache, LatentCache, LinearStateCache
from .blocks import BlockPool
from .paged import GroupStep, LayerStorage, PagedKVCache, PagedLatentCache
from .scheduler import CacheGroup, Request, SamplingParams, Scheduler
from .states import LayerStates, SlotPool

__all__ = ["Engine", "RequestOutput", "generate_many", "DEFAULT_MAX_BATCHED_TOKENS", "DEFAULT_MAX_NUM_SEQS"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_BATCHED_TOKENS = 2048
"""Tokens a step computes at most, decoding and prefill together (vLLM's ``max_num_batched_tokens``)."""

DEFAULT_MAX_NUM_SEQS = 256
"""Requests running at once at most (vLLM's ``max_num_seqs``); also the state slots of a model with linear layers."""


@dataclass(frozen=True)
class RequestOutput:
    """What a step did for one request: the tokens it chose (none for a prefill chunk that did not reach the prompt's
    end), their log-probabilities under the model (before temperature, top-k or top-p), and whether the request
    finished (``finish_reason``: "stop" at a stop token, "length" at max_new_tokens, "cancelled")."""

    request_id: int
    new_tokens: list[int]
    finished: bool
    finish_reason: str | None = None
    logprobs: tuple[float, ...] = ()


class Engine:
    """Serve many requests on one decoder-only ``model`` (module docstring).

    Args:
        model: an attnkit decoder-only LM (``new_cache``, ``forward(ids, attention_mask, cache=, position_ids=,
            last_only=)``): GPT-2, Llama, Mistral, Qwen2, DeepSeek-V3/V3.2, Qwen3-Next, Qwen3.5, Kimi Linear,
            MiniMax-01, Mamba-2, Bamba, Granite 4.0-H, Nemotron-H, Falcon-H1 (as ``load_hf_folder`` loads them). An
            encoder-decoder is refused by name.
        block_size: token positions per KV block.
        num_blocks: blocks per cache group (the storage grows to it as blocks are first used); default: room for
            ``max_num_seqs`` requests of min(the model's positions, 2,048) tokens.
        max_batched_tokens: tokens a step computes at most (decoding and prefill chunks together).
        max_num_seqs: requests running at once at most (the state slots of a model with linear layers).
        prefix_caching: reuse the blocks of a prompt's prefix another request computed. On where it is exact: models
            whose every layer is full softmax or latent attention; a model with linear layers (their state is not
            kept at block boundaries) or sliding windows runs without it, and ``stats()["prefix_caching_off"]``
            says why.
    """

    def __init__(self, model, *, block_size: int = 16, num_blocks: int | None = None,
                 max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS, max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
                 prefix_caching: bool = True) -> None:
        for name, value in (("block_size", block_size), ("max_batched_tokens", max_batched_tokens),
                            ("max_num_seqs", max_num_seqs)):
            _check_int(name, value)
        if num_blocks is not None:
            _check_int("num_blocks", num_blocks)
        if not isinstance(prefix_caching, bool):
            raise TypeError(f"prefix_caching must be True or False, got {prefix_caching!r}")
        self.kinds = _layer_kinds(model)
        self.model = model.eval()
        parameter = next(model.parameters())
        self.device = parameter.device
        config = model.config
        self.vocab_size = int(config.vocab_size)
        self.max_len = getattr(config, "max_len", math.inf)
        self.block_size, self.max_batched_tokens, self.max_num_seqs = block_size, max_batched_tokens, max_num_seqs
        windows = sorted({kind[1] for kind in self.kinds if kind is not None and kind[0] != "state"},
                         key=lambda w: (w is not None, w or 0))
        has_states = any(kind is not None and kind[0] in ("state", "parallel") for kind in self.kinds)
        self.prefix_caching_off: str | None = None
        if not prefix_caching:
            self.prefix_caching_off = "off (prefix_caching=False)"
        elif has_states or windows not in ([], [None]):
            self.prefix_caching_off = ("a model with linear layers (their state is not kept at block boundaries)"
                                       if has_states else "a model with sliding-window layers")
            logger.info("prefix caching is off for %s: %s", type(model).__name__, self.prefix_caching_off)
        enabled = self.prefix_caching_off is None
        if num_blocks is None:
            longest = int(min(self.max_len, 2048))
            num_blocks = max_num_seqs * math.ceil(longest / block_size)
        self.groups = [CacheGroup(window, BlockPool(num_blocks, prefix_caching=enabled)) for window in windows]
        self.storage = {i: LayerStorage(num_blocks, block_size) for i, kind in enumerate(self.kinds)
                        if kind is not None and kind[0] != "state"}
        self.index_storage = {i: LayerStorage(num_blocks, block_size) for i, kind in enumerate(self.kinds)
                              if kind is not None and kind[0] == "latent"}
        self.states = {i: LayerStates(max_num_seqs) for i, kind in enumerate(self.kinds)
                       if kind is not None and kind[0] in ("state", "parallel")}
        slots = SlotPool(max_num_seqs) if self.states else None
        self.scheduler = Scheduler(self.groups, slots, block_size=block_size, max_batched_tokens=max_batched_tokens,
                                   max_num_seqs=max_num_seqs, prefix_caching=enabled)
        self.requests: dict[int, Request] = {}
        self._cancelled: list[Request] = []
        self._next_id = 0
        self.steps = 0
        self.generated_tokens = 0
        self.computed_tokens = 0

    # -- requests -------------------------------------------------------------------------------------------
    def add_request(self, prompt_ids: Sequence[int] | Tensor, *, max_new_tokens: int, temperature: float = 0.0,
                    top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                    stop_tokens: Sequence[int] = (), salt: str | None = None) -> int:
        """Queue a request and return its id. ``prompt_ids``: token ids (a list or a 1-D tensor); ``temperature``
        0 is greedy; ``seed`` seeds the request's own generator (its draws do not depend on the other requests);
        ``stop_tokens`` end it (the stop token is its last); ``salt`` keeps its prefix blocks apart from requests of
        another salt (a per-tenant cache). Bad input is refused by name before anything is queued."""
        prompt = _token_list(prompt_ids, self.vocab_size)
        _check_int("max_new_tokens", max_new_tokens)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature < math.inf:
            raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature!r}")
        if top_k is not None:
            _check_int("top_k", top_k)
        if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__} {seed!r}")
        if salt is not None and not isinstance(salt, str):
            raise TypeError(f"salt must be a string or None, got {type(salt).__name__}")
        stops = frozenset(_token_list(list(stop_tokens), self.vocab_size, name="stop_tokens", empty=True))
        if len(prompt) + max_new_tokens > self.max_len:
            raise ValueError(f"prompt_ids ({len(prompt):,} tokens) plus max_new_tokens {max_new_tokens:,} exceed the "
                             f"model's {self.max_len:,} positions")
        positions = len(prompt) + max_new_tokens - 1  # (the last token chosen is never computed)
        for group in self.groups:
            need = group.most_blocks(positions, self.block_size, self.max_batched_tokens)
            if need > group.pool.num_blocks:
                what = "full attention" if group.window is None else f"a window of {group.window}"
                raise ValueError(f"the pool's {group.pool.num_blocks} blocks of {self.block_size} tokens ({what}) cannot "
                                 f"hold this request: its prompt of {len(prompt):,} tokens and max_new_tokens "
                                 f"{max_new_tokens:,} need {need} blocks; give Engine a larger num_blocks")
        generator = None
        if temperature > 0:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,)).item()))
        params = SamplingParams(max_new_tokens, float(temperature), top_k, top_p, seed, stops)
        request = Request(self._next_id, prompt, len(prompt), params, salt=salt, generator=generator)
        self.requests[request.id] = request
        self.scheduler.waiting.append(request)
        self._next_id += 1
        return request.id

    def cancel(self, request_id: int) -> bool:
        """Stop a request: its blocks and slot are freed at the next step, which reports it finished ("cancelled").
        False for a request already finished; an id the engine never gave is refused."""
        request = self._request(request_id)
        if request.status == "finished" or request.cancelled:
            return False
        request.cancelled = True
        self._cancelled.append(request)
        return True

    def has_unfinished(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running or self._cancelled)

    def tokens(self, request_id: int) -> list[int]:
        """The tokens a request has generated so far (all of them once it finished)."""
        return list(self._request(request_id).generated)

    def logprobs(self, request_id: int) -> list[float]:
        return list(self._request(request_id).logprobs)

    def finish_reason(self, request_id: int) -> str | None:
        return self._request(request_id).finish_reason

    def forget(self, request_id: int) -> None:
        """Drop a finished request's record (a long-running server forgets what it answered)."""
        request = self._request(request_id)
        if request.status != "finished":
            raise ValueError(f"request {request_id} has not finished; cancel it first")
        del self.requests[request_id]

    def _request(self, request_id: int) -> Request:
        request = self.requests.get(request_id) if isinstance(request_id, int) and not isinstance(request_id, bool) else None
        if request is None:
            raise KeyError(f"request_id {request_id!r} is not a request of this engine (ids given so far: 0.."
                           f"{self._next_id - 1})")
        return request

    # -- steps ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> list[RequestOutput]:
        """One step: cancelled requests freed, the scheduler's tokens computed, a token chosen for every request
        whose tokens are all in the caches. One :class:`RequestOutput` per request that moved."""
        outputs: dict[int, RequestOutput] = {}
        for request in self._cancelled:
            if request.status != "finished":
                self.scheduler.finish(request, "cancelled")
                outputs[request.id] = RequestOutput(request.id, [], True, "cancelled")
        self._cancelled = []
        plan = self.scheduler.schedule()
        decoding = [(r, n) for r, n in plan if n == 1 and r.computed > 0]
        runs = _by_length(decoding, self.block_size) + [[(r, n)] for r, n in plan if not (n == 1 and r.computed > 0)]
        for run in runs:
            rows = [request for request, _ in run]
            count = run[0][1]
            logits = self._forward(rows, count)
            scores = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)  # (B, V)
            greedy = logits.argmax(-1).tolist()  # (as generate chooses: on the logits themselves)
            self.computed_tokens += count * len(rows)
            for b, request in enumerate(rows):
                self.scheduler.computed(request, count)
                if request.pending:
                    outputs[request.id] = RequestOutput(request.id, [], False)
                    continue
                token, logprob = self._choose(request, logits[b], scores[b], greedy[b])
                request.tokens.append(token)
                request.logprobs.append(logprob)
                self.generated_tokens += 1
                params = request.params
                reason = ("stop" if token in params.stop_tokens else
                          "length" if len(request.tokens) - request.prompt_length >= params.max_new_tokens else None)
                if reason is not None:
                    self.scheduler.finish(request, reason)
                outputs[request.id] = RequestOutput(request.id, [token], reason is not None, reason, (logprob,))
        self.steps += 1
        return list(outputs.values())

    def stream(self, request_id: int) -> Iterator[list[int]]:
        """The tokens of one request as they come (each step's), stepping the engine (every request moves)."""
        request = self._request(request_id)
        while request.status != "finished":
            for out in self.step():
                if out.request_id == request_id and out.new_tokens:
                    yield out.new_tokens

    def run(self) -> Iterator[RequestOutput]:
        """Step until every request has finished, yielding each step's outputs."""
        while self.has_unfinished():
            yield from self.step()

    def _forward(self, rows: list[Request], count: int) -> Tensor:
        """The logits (B, V) of the last of ``count`` new tokens of each row, through the paged caches."""
        device = self.device
        ids = torch.tensor([r.tokens[r.computed:r.computed + count] for r in rows], dtype=torch.long, device=device)
        positions = torch.tensor([list(range(r.computed, r.computed + count)) for r in rows], dtype=torch.long,
                                 device=device)
        steps = {group.window: GroupStep.build([r.tables[group.window] for r in rows], [r.computed for r in rows],
                                               count, self.block_size, group.window, device) for group in self.groups}
        slots = [r.slot for r in rows]
        fresh = all(r.computed == 0 for r in rows)
        caches: list = []
        kept: list[tuple[int, LinearStateCache]] = []
        for i, kind in enumerate(self.kinds):
            if kind is None:
                caches.append(None)
            elif kind[0] == "kv":
                caches.append(PagedKVCache(self.storage[i], steps[kind[1]]))
            elif kind[0] == "latent":
                caches.append(PagedLatentCache(self.storage[i], self.index_storage[i], steps[kind[1]]))
            else:
                state = self.states[i].cache_for(slots, fresh, device)  # type: ignore[arg-type]
                kept.append((i, state))
                if kind[0] == "state":
                    caches.append(state)
                else:  # Falcon-H1's layer: attention and Mamba-2 side by side
                    from ..models.falcon_h1 import ParallelCache

                    both = ParallelCache()
                    both.attention, both.ssm = PagedKVCache(self.storage[i], steps[kind[1]]), state
                    caches.append(both)
        # no attention mask: each paged cache rules its padding out with its step's key mask, and a linear layer's
        # own tokens are never padding (a batch decodes one token a row; a prefill chunk is a row alone)
        logits = self.model(ids, cache=caches, position_ids=positions, last_only=True).logits[:, -1]
        for i, state in kept:
            self.states[i].keep(state, slots)  # type: ignore[arg-type]
        return logits

    def _choose(self, request: Request, logits: Tensor, scores: Tensor, greedy: int) -> tuple[int, float]:
        """The request's next token from its row of logits (V,) (``greedy``: their argmax), and its log-probability
        under the model (``scores``, the row's log-softmax)."""
        params = request.params
        token = greedy if params.temperature == 0 else int(sample_next(
            logits[None], temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
            generator=request.generator)[0])
        return token, float(scores[token])

    # -- accounting -----------------------------------------------------------------------------------------
    def held_blocks(self) -> int:
        """Blocks the live requests hold, each counted once (a shared prefix block once)."""
        held: set[tuple[int | None, int]] = set()
        for request in (*self.scheduler.running, *self.scheduler.waiting):
            for window, table in request.tables.items():
                held.update((window, block) for block in table if block is not None)
        return len(held)

    def _bytes_per_block(self, window: int | None) -> int:
        """Bytes one block of the group of ``window`` takes: its layers' keys and values (DSA's indexer keys too)."""
        return sum(storage.bytes_per_block() + (self.index_storage[i].bytes_per_block() if i in self.index_storage else 0)
                   for i, storage in self.storage.items() if self.kinds[i][1] == window)

    def stats(self) -> dict:
        """The pool's and the scheduler's counters, as data (what ``attnkit serve``'s /metrics reads)."""
        pools = [group.pool for group in self.groups]
        per_block = {group.window: self._bytes_per_block(group.window) for group in self.groups}
        per_slot = sum(states.bytes_per_slot() for states in self.states.values())
        in_use = sum(pool.in_use for pool in pools)
        slots = self.scheduler.slots
        return {
            "blocks_total": sum(pool.num_blocks for pool in pools), "blocks_in_use": in_use,
            "cached_blocks": sum(pool.num_cached for pool in pools),
            "cached_free_blocks": sum(pool.cached_free for pool in pools),
            "prefix_hit_tokens": sum(pool.hit_tokens for pool in pools),
            "evictions": sum(pool.evictions for pool in pools), "block_size": self.block_size,
            "bytes_per_block": sum(per_block.values()),  # (several groups: one block of each, together)
            "bytes_held": sum(group.pool.in_use * per_block[group.window] for group in self.groups),
            "slots_total": 0 if slots is None else slots.num_slots, "slots_in_use": 0 if slots is None else slots.in_use,
            "state_bytes_per_slot": per_slot, "preemptions": self.scheduler.preemptions,
            "running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
            "finished": sum(1 for r in self.requests.values() if r.status == "finished"), "steps": self.steps,
            "generated_tokens": self.generated_tokens, "computed_tokens": self.computed_tokens,
            "prefix_caching": self.prefix_caching_off is None, "prefix_caching_off": self.prefix_caching_off,
        }


SPLIT_SAVING = 0.3
"""A decoding batch is split by context length where that saves at least this share of the key columns its
attention reads (every row reads as many as the longest: short rows read padding); at most :data:`MAX_SPLITS`
forwards."""

MAX_SPLITS = 3


def _by_length(decoding: list[tuple[Request, int]], block_size: int) -> list[list[tuple[Request, int]]]:
    """The decoding rows as one batch, or as a few of like context length where the padding the short ones would
    read is worth another forward (:data:`SPLIT_SAVING`). Which batch a row joins changes its numbers only to float
    rounding, as any batch does."""
    if not decoding:
        return []
    batches = [sorted(decoding, key=lambda row: row[0].computed)]
    while len(batches) < MAX_SPLITS:
        costs = [len(batch) * (batch[-1][0].computed // block_size + 1) for batch in batches]
        widest = max(range(len(batches)), key=costs.__getitem__)
        rows = batches[widest]
        blocks = [row[0].computed // block_size + 1 for row in rows]
        best, split = costs[widest], 0
        for index in range(2, len(rows) - 1):  # (a batch of one row is a forward for little)
            cost = index * blocks[index - 1] + (len(rows) - index) * blocks[-1]
            if cost < best:
                best, split = cost, index
        if not split or best > (1 - SPLIT_SAVING) * costs[widest]:
            break
        batches[widest:widest + 1] = [rows[:split], rows[split:]]
    return batches


def _layer_kinds(model) -> list:
    """Per layer what it caches, from the model's own ``new_cache()``: ("kv", window), ("latent", None), ("state",),
    ("parallel", window) (attention beside Mamba-2) or None (no token mixer)."""
    new_cache = getattr(model, "new_cache", None)
    if new_cache is None or not hasattr(model, "config"):
        raise TypeError(f"attnkit.serving serves decoder-only language models (a new_cache() and a config); "
                        f"{type(model).__name__} is not one (an encoder-decoder translates with "
                        "attnkit.decoding.translate / beam_search, which the engine does not serve)")
    kinds: list = []
    for i, cache in enumerate(new_cache()):
        if cache is None:
            kinds.append(None)
        elif hasattr(cache, "attention") and hasattr(cache, "ssm"):
            kinds.append(("parallel", cache.attention.window))
        elif isinstance(cache, LatentCache):
            kinds.append(("latent", None))
        elif isinstance(cache, LinearStateCache):
            kinds.append(("state",))
        elif type(cache) is KVCache:
            kinds.append(("kv", cache.window))
        else:
            raise TypeError(f"layer {i} of {type(model).__name__} keeps a {type(cache).__name__}, which the engine "
                            "cannot page")
    return kinds


def _check_int(name: str, value, least: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")


def _token_list(ids, vocab_size: int, name: str = "prompt_ids", empty: bool = False) -> list[int]:
    """Token ids as a list of ints in [0, vocab_size), refused by name otherwise (an empty prompt too)."""
    if isinstance(ids, Tensor):
        if ids.dim() != 1 or ids.is_floating_point() or ids.dtype == torch.bool:
            raise ValueError(f"{name} must be a 1-D integer tensor, got {ids.dtype} {tuple(ids.shape)}")
        ids = ids.tolist()
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise TypeError(f"{name} must be a sequence of token ids, got {type(ids).__name__}")
    ids = list(ids)
    if not ids and not empty:
        raise ValueError(f"{name} is empty: a request needs at least one token")
    for index, token in enumerate(ids):
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
            raise ValueError(f"{name}[{index}] = {token!r} is not a token id of this model's vocabulary "
                             f"[0, {vocab_size})")
    return ids


def generate_many(model, prompts: Sequence[Sequence[int]], *, max_new_tokens: int = 64, temperature: float = 0.0,
                  top_k: int | None = None, top_p: float | None = None, seed: int | Sequence[int] | None = None,
                  stop_tokens: Sequence[int] = (), progress: bool = False, **engine_options) -> list[list[int]]:
    """Continue every prompt (token ids) through one :class:`Engine`: the generated tokens of each, in the prompts'
    order (a stop token, where one ended it, last), as :func:`attnkit.generate` gives them for a prompt alone.
    ``seed``: one for every request (each its own generator seeded with it) or one per prompt; ``engine_options``
    go to :class:`Engine` (block_size, num_blocks, max_batched_tokens, max_num_seqs, prefix_caching)."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
        raise ValueError("prompts must be a non-empty list of token-id lists")
    seeds = list(seed) if isinstance(seed, Sequence) else [seed] * len(prompts)
    if len(seeds) != len(prompts):
        raise ValueError(f"seed: one per prompt ({len(prompts)}), got {len(seeds)}")
    engine = Engine(model, **engine_options)
    ids = [engine.add_request(prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                              top_p=top_p, seed=s, stop_tokens=stop_tokens) for prompt, s in zip(prompts, seeds)]
    with progress_bar(total=len(ids), progress=progress, desc="generate", unit="request") as shown:
        for out in engine.run():
            if out.finished:
                shown.update(1)
    return [engine.tokens(i) for i in ids]
