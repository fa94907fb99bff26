"""Block masks of the named patterns in closed form: tile tables written directly, no mask evaluated.

:func:`attnkit.masks.block_mask` learns which tiles are empty, partial or full by evaluating the
``mask_mod`` on all L x S pairs, a band of query blocks at a time: exact for any function, but
O(L x S) work (a 64K Longformer mask takes about 30 s on 2 cores). The patterns here know their
tiles from a few numbers per block, in O(number of tiles) vectorised work and memory of a few bytes
per tile, and attach the same ``mask_mod`` for the partial tiles:

- a **band** of key-minus-query offsets ``lo <= j - i <= hi`` covers causal masks (any offset),
  causal sliding windows and two-sided windows. Over a tile of queries [a, b] and keys [c, d] the
  offsets are exactly the integers in [c - b, d - a], so the tile is non-empty iff that interval
  meets [lo, hi] and full iff it lies inside it;
- **Longformer** adds global tokens: a tile is full iff all its queries are global, or all its keys
  are, or the band covers the offsets between its non-global queries and keys (their extremes);
- **documents** (packed sequences, ids non-decreasing): the ids present in a block are all the ids
  between its smallest and largest, so two blocks share a document iff the ranges meet;
- **prefix-LM** and **StreamingLLM sinks** are a band plus a prefix of always-visible keys.

Every builder returns the tiles that evaluating the mask densely would give (tests compare them at
many shapes, and benchmarks/block_masks.py at 64K).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._deprecated import UNSET, renamed
from . import mask_mods as _mods
from . import masks as _masks
from .block_mask import DEFAULT_BLOCK, BlockMask, _block_sizes, block_mask, kinds_of
from .checks import check_int

__all__ = [
    "band_kinds",
    "causal_block_mask",
    "window_block_mask",
    "longformer_block_mask",
    "document_block_mask",
    "document_ids",
    "prefix_lm_block_mask",
    "sinks_block_mask",
    "pattern_block_mask",
]

_INF = 1 << 62


def _extents(n: int, block: int, device) -> tuple[Tensor, Tensor]:
    """First and last index of every block of ``block`` positions over [0, n): two (blocks,) int64."""
    first = torch.arange(0, n, block, device=device, dtype=torch.int64)
    return first, torch.clamp(first + block - 1, max=n - 1)


BAND_TILES = 1 << 22
"""Tiles whose kinds are worked out at once (a few bytes of temporaries each): a million-token mask
(8192 x 8192 tiles of 128) is written in bands of 512 query blocks, so that the peak memory is the
table itself (64 MiB) plus about 50 MiB."""


def _banded(batch: int, num_q: int, num_k: int, device, rows) -> Tensor:
    """(batch, 1, num_q, num_k) kinds, filled a band of query blocks at a time by
    ``rows(i0, i1) -> (non-empty, full)`` boolean grids broadcastable to (batch, i1 - i0, num_k)."""
    kinds = torch.empty(batch, 1, num_q, num_k, dtype=torch.int8, device=device)
    band = max(1, BAND_TILES // max(1, batch * num_k))
    for i0 in range(0, num_q, band):
        i1 = min(num_q, i0 + band)
        nonempty, full = rows(i0, i1)
        kinds[:, 0, i0:i1] = kinds_of(nonempty, full)
    return kinds


def _band(a: Tensor, b: Tensor, c: Tensor, d: Tensor, lo: int, hi: int) -> tuple[Tensor, Tensor]:
    """(non-empty, full) grids of the band lo <= j - i <= hi over tiles of queries [a, b] and keys
    [c, d] (a, b: (..., nQ, 1); c, d: (..., 1, nK)). Offsets in a tile: exactly [c - b, d - a]."""
    nonempty = (c <= b + hi) & (d >= a + lo)
    full = (c >= b + lo) & (d <= a + hi)
    return nonempty, full


def band_kinds(L: int, S: int, block: tuple[int, int], lo: int | None, hi: int | None, device=None) -> Tensor:
    """(1, 1, nQ, nK) kinds of the mask ``lo <= j - i <= hi`` (None: unbounded on that side)."""
    a, b = _extents(L, block[0], device)
    c, d = _extents(S, block[1], device)
    lo, hi = -_INF if lo is None else lo, _INF if hi is None else hi
    return _banded(1, len(a), len(c), device,
                   lambda i0, i1: _band(a[i0:i1, None], b[i0:i1, None], c[None, :], d[None, :], lo, hi))


def _result(kinds: Tensor, shape, block, mod) -> BlockMask:
    return BlockMask(kinds, shape, block, mask_mod=mod)


def _lengths(L: int, S: int | None) -> tuple[int, int]:
    _masks._check_length("L", L)
    S = L if S is None else S
    _masks._check_length("S", S)
    return L, S


def causal_block_mask(L: int, S: int | None = None, *, causal_align: str = "top-left",
                      block: int | tuple[int, int] = DEFAULT_BLOCK, device=None) -> BlockMask:
    """Causal (``j <= i + offset``, offset from ``causal_align``) as a block mask, in closed form."""
    L, S = _lengths(L, S)
    offset = _masks.causal_offset(L, S, causal_align)
    block = _block_sizes(block)
    return _result(band_kinds(L, S, block, None, offset, device), (1, 1, L, S), block,
                   _masks.causal_mod(L, S, causal_align=causal_align))


def window_block_mask(L: int, S: int | None = None, *, width=UNSET, window: int | None = None, causal=UNSET,
                      causal_align: str = "top-left", block: int | tuple[int, int] = DEFAULT_BLOCK,
                      device=None) -> BlockMask:
    """A sliding window as a block mask, in closed form: a two-sided band ``|i - j| <= width // 2``
    (:func:`~attnkit.masks.window_mod`, encoders), or Mistral's causal ``window``,
    ``a - window < j <= a`` with a the query's aligned position (``causal_align``).

    ``window`` without ``causal=True`` is the deprecated spelling of ``width`` (it warns and stays
    two-sided for one release); ``causal=True`` with ``window`` is the causal window."""
    L, S = _lengths(L, S)
    block = _block_sizes(block)
    causal = False if causal is UNSET else causal
    if width is UNSET and window is not None and not causal:
        width, window = renamed("window_block_mask", "window", "width", window, UNSET, None), None
    if width is not UNSET:
        if window is not None or causal:
            raise TypeError("window_block_mask: width= is a two-sided band; a causal window is window= alone")
        radius = _mods._non_negative("width", width) // 2
        return _result(band_kinds(L, S, block, -radius, radius, device), (1, 1, L, S), block, _masks.window_mod(width))
    window = check_int("window", window, 1)
    offset = _masks.causal_offset(L, S, causal_align)
    kinds = band_kinds(L, S, block, offset - window + 1, offset, device)
    return _result(kinds, (1, 1, L, S), block, _masks.sinks_window_mod(0, window, L, S, causal_align=causal_align))


def _block_reduce(values: Tensor, block: int, fill, op: str) -> Tensor:
    """Reduce (B, n) values over blocks of ``block`` positions: (B, blocks). ``fill`` pads the last."""
    B, n = values.shape
    blocks = -(-n // block)
    padded = torch.nn.functional.pad(values, (0, blocks * block - n), value=fill).view(B, blocks, block)
    return getattr(padded, op)(dim=-1)


def longformer_block_mask(width=UNSET, global_tokens: Tensor | None = None, *,
                          block: int | tuple[int, int] = DEFAULT_BLOCK, window=UNSET) -> BlockMask:
    """Longformer (:func:`~attnkit.masks.longformer_mod`: a two-sided band of ``width`` plus global
    tokens) as a block mask, in closed form. global_tokens: (L,) or (B, L) boolean; L = S
    (self-attention). ``window`` is the deprecated old name of ``width``."""
    width = renamed("longformer_block_mask", "window", "width", window, width, UNSET)
    if global_tokens is None:
        raise TypeError("longformer_block_mask needs global_tokens, (L,) or (B, L) boolean")
    mod = _masks.longformer_mod(width, global_tokens)
    table = _mods._per_example("global_tokens", global_tokens, "bool")
    B, L = table.shape
    block_q, block_k = _block_sizes(block)
    radius = width // 2
    device = table.device
    positions = torch.arange(L, device=device, dtype=torch.int64).expand(B, L)
    grids = []
    for size in (block_q, block_k):
        every = _block_reduce(table, size, True, "all")  # (B, blocks): all positions global
        some = _block_reduce(table, size, False, "any")
        low = _block_reduce(torch.where(table, _INF, positions), size, _INF, "amin")  # non-global extremes
        high = _block_reduce(torch.where(table, -_INF, positions), size, -_INF, "amax")
        grids.append((every, some, low, high))
    (q_all, q_any, q_low, q_high), (k_all, k_any, k_low, k_high) = grids
    a, b = _extents(L, block_q, device)
    c, d = _extents(L, block_k, device)

    def rows(i0, i1):
        band_some, _ = _band(a[i0:i1, None], b[i0:i1, None], c[None, :], d[None, :], -radius, radius)
        nonempty = band_some[None] | q_any[:, i0:i1, None] | k_any[:, None, :]
        # Pairs with a global query or key are allowed; the rest need the band between the
        # non-global extremes (the band over the whole tile is the special case of no globals).
        q_low_, q_high_ = q_low[:, i0:i1, None], q_high[:, i0:i1, None]
        rest_full = (k_low[:, None, :] >= q_high_ - radius) & (k_high[:, None, :] <= q_low_ + radius)
        return nonempty, q_all[:, i0:i1, None] | k_all[:, None, :] | rest_full

    return _result(_banded(B, len(a), len(c), device, rows), (B, 1, L, L), (block_q, block_k), mod)


def document_ids(lengths: Tensor | list[int], total: int | None = None) -> Tensor:
    """Document ids (L,) of packed sequences from their lengths (or from ``cu_seqlens``-style
    offsets, pass ``torch.diff(cu_seqlens)``): 0 for the first ``lengths[0]`` tokens, 1 for the next,
    ...; positions beyond ``sum(lengths)`` up to ``total`` are padding (-1)."""
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1 or lengths.is_floating_point() or lengths.dtype == torch.bool or bool((lengths < 0).any()):
        raise ValueError(f"lengths must be non-negative integers of shape (documents,), got {lengths!r}")
    ids = torch.repeat_interleave(torch.arange(len(lengths), device=lengths.device), lengths)
    used = ids.numel()
    total = used if total is None else total
    if total < used:
        raise ValueError(f"total must be at least sum(lengths) = {used}, got {total}")
    return torch.nn.functional.pad(ids, (0, total - used), value=-1)


def document_block_mask(document_ids: Tensor, *, causal: bool = True,
                        block: int | tuple[int, int] = DEFAULT_BLOCK) -> BlockMask:
    """Packed documents (:func:`~attnkit.masks.document_mod`) as a block mask, in closed form.

    document_ids: (L,) or (B, L) integers, non-decreasing over the real tokens (negative ids are
    padding, anywhere); build them from lengths with :func:`document_ids`. Ids in another order
    are evaluated densely (:func:`~attnkit.masks.block_mask`), with the same result."""
    mod = _masks.document_mod(document_ids, causal=causal)
    table = _mods._per_example("document_ids", document_ids, "int")
    B, L = table.shape
    block_q, block_k = _block_sizes(block)
    table = table.to(torch.int64)
    valid = table >= 0
    big, small = _INF, -_INF  # powers of two: F.pad's fill goes through a float exactly
    real = torch.where(valid, table, big)
    cummax = torch.where(valid, table, small).cummax(dim=1).values
    packed = bool((~valid | (real >= cummax)).all())  # each real id >= every real id before it
    if not packed or (causal and block_q != block_k):
        return _masks.block_mask(mod, B, None, L, L, block=(block_q, block_k), device=table.device)
    stats = []
    for size in (block_q, block_k):
        low = _block_reduce(real, size, big, "amin")
        high = _block_reduce(torch.where(valid, table, small), size, small, "amax")
        clean = _block_reduce(valid, size, True, "all")
        stats.append((low, high, clean, low <= high))  # (B, blocks); last: some real token
    (q_low, q_high, q_clean, q_some), (k_low, k_high, k_clean, k_some) = stats
    q_single, k_single = (q_low == q_high) & q_clean, (k_low == k_high) & k_clean
    a, b = _extents(L, block_q, table.device)
    c, d = _extents(L, block_k, table.device)

    def rows(i0, i1):
        low, high = q_low[:, i0:i1, None], q_high[:, i0:i1, None]
        nonempty = (low <= k_high[:, None, :]) & (k_low[:, None, :] <= high) & q_some[:, i0:i1, None] & k_some[:, None, :]
        full = q_single[:, i0:i1, None] & k_single[:, None, :] & (low == k_low[:, None, :])
        if causal:
            some, every = _band(a[i0:i1, None], b[i0:i1, None], c[None, :], d[None, :], -_INF, 0)
            nonempty, full = nonempty & some, full & every
        return nonempty, full

    return _result(_banded(B, len(a), len(c), table.device, rows), (B, 1, L, L), (block_q, block_k), mod)


def prefix_lm_block_mask(L: int, prefix_lengths: int | Tensor, S: int | None = None, *,
                         block: int | tuple[int, int] = DEFAULT_BLOCK, device=None) -> BlockMask:
    """Prefix LM (:func:`~attnkit.masks.prefix_lm_mod`: ``j <= i or j < prefix``) as a block mask,
    in closed form; ``prefix_lengths`` an int or (B,) integers."""
    L, S = _lengths(L, S)
    mod = _masks.prefix_lm_mod(prefix_lengths)
    block = _block_sizes(block)
    if isinstance(prefix_lengths, Tensor):
        device = prefix_lengths.device
        prefix = prefix_lengths.to(torch.int64)[:, None, None]
    else:
        prefix = torch.tensor(prefix_lengths, dtype=torch.int64, device=device).view(1, 1, 1)
    a, b = _extents(L, block[0], device)
    c, d = _extents(S, block[1], device)

    def rows(i0, i1):
        some, every = _band(a[i0:i1, None], b[i0:i1, None], c[None, :], d[None, :], -_INF, 0)
        return some[None] | (c[None, None, :] < prefix), every[None] | (d[None, None, :] < prefix)

    return _result(_banded(prefix.shape[0], len(a), len(c), device, rows), (prefix.shape[0], 1, L, S), block, mod)


def sinks_block_mask(L: int, S: int | None = None, *, sinks: int, window: int, causal_align: str = "top-left",
                     block: int | tuple[int, int] = DEFAULT_BLOCK, device=None) -> BlockMask:
    """StreamingLLM (:func:`~attnkit.masks.sinks_window_mod`: the first ``sinks`` keys and a causal
    window of ``window``) as a block mask, in closed form."""
    L, S = _lengths(L, S)
    offset = _masks.causal_offset(L, S, causal_align)
    mod = _masks.sinks_window_mod(sinks, window, L, S, causal_align=causal_align)
    block = _block_sizes(block)
    a, b = _extents(L, block[0], device)
    c, d = _extents(S, block[1], device)
    first_late = torch.clamp(c, min=sinks)[None, :]  # the smallest key of each tile outside the sinks

    def rows(i0, i1):
        a_, b_, c_, d_ = a[i0:i1, None], b[i0:i1, None], c[None, :], d[None, :]
        band_some, _ = _band(a_, b_, c_, d_, offset - window + 1, offset)
        nonempty = band_some | ((c_ <= b_ + offset) & (c_ < sinks))
        full = (d_ <= a_ + offset) & ((d_ < sinks) | (first_late > b_ + offset - window))
        return nonempty, full

    return _result(_banded(1, len(a), len(c), device, rows), (1, 1, L, S), block, mod)




def closed_form(name: str, L: int, S: int, *, block, device=None, **options) -> BlockMask | None:
    """The block mask of :data:`attnkit.masks.PATTERNS` entry ``name`` with the same options, built
    in closed form; None for a pattern without one (bigbird, dilated: evaluated densely)."""
    block = _block_sizes(block)
    options = _mods.pattern_options(name, options)
    if name == "causal":
        align = options.get("causal_align", "top-left")
        return causal_block_mask(L, S, causal_align=align, block=block, device=device)
    if name == "window":
        return window_block_mask(L, S, width=options.get("width", 512), block=block, device=device)
    if name == "longformer" and L == S:
        flags = torch.zeros(L, dtype=torch.bool, device=device)
        flags[: options.get("num_global", 16)] = True
        return longformer_block_mask(options.get("width", 512), flags, block=block)
    if name == "documents" and L == S:
        documents = options.get("documents", 8)
        ids = torch.arange(L, device=device) * documents // max(1, L)
        return document_block_mask(ids, block=block)
    if name == "prefix-lm":
        prefix = options.get("prefix")
        return prefix_lm_block_mask(L, L // 4 if prefix is None else prefix, S, block=block, device=device)
    if name == "sinks":
        return sinks_block_mask(L, S, sinks=options.get("sinks", 4), window=options.get("window", 512), block=block,
                                device=device)
    return None


def pattern_block_mask(
    name: str, L: int, S: int | None = None, *, B: int | None = None, H: int | None = None,
    block: int | tuple[int, int] = DEFAULT_BLOCK, device=None, **options,
) -> BlockMask:
    """The :class:`BlockMask` of a named pattern from :data:`attnkit.masks.PATTERNS` (``attnkit bench``,
    ``cost``), with its options.

    Without ``B`` and ``H``, causal, window, Longformer, documents, prefix-LM and sinks are built in
    closed form (:func:`closed_form`: O(tiles), a million tokens in under a second); the others, and
    per-batch or per-head ones, evaluate the mask_mod on every pair (:func:`attnkit.masks.block_mask`)."""
    if name not in _masks.PATTERNS:
        raise ValueError(f"pattern must be one of {sorted(_masks.PATTERNS)}, got {name!r}")
    S = L if S is None else S
    options = _mods.pattern_options(name, options)
    mod = _masks.PATTERNS[name](L, S, **options)  # validates the options, and is the mask evaluated otherwise
    if B is None and H is None:
        built = closed_form(name, L, S, block=block, device=device, **options)
        if built is not None:
            return built
    return block_mask(mod, B, H, L, S, block=block, device=device)
