"""The flex backend's tile tables: attnkit's EMPTY / PARTIAL / FULL kinds on FlexAttention's 128 x 128
tiles, written straight into torch's ``BlockMask`` format (counts and column indices of the partial
and the full tiles, and their transposes for the backward pass). No mask function is evaluated and
no L x S tensor exists. The converted tables, and the prepared calls built from them, are kept on the
block mask, or for the structure alone in a bounded cache (:func:`cached`).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import Tensor

from ..block_mask import EMPTY, FULL, PARTIAL, BlockMask, _classify, kinds_of
from ..block_patterns import BAND_TILES, band_kinds
from .common import Problem

BLOCK = 128
"""FlexAttention's tile size, both ways."""


def _pad_kinds(kinds: Tensor, num_q: int, num_k: int) -> Tensor:
    """Kinds padded with EMPTY tiles up to (num_q, num_k) tiles."""
    return F.pad(kinds, (0, num_k - kinds.shape[-1], 0, num_q - kinds.shape[-2]), value=EMPTY)


def tile_kinds(mask: BlockMask) -> Tensor:
    """An attnkit block mask's kinds on BLOCK x BLOCK tiles, from its own table when its tiles
    divide BLOCK (a tile is empty iff all its sub-tiles are, full iff all are), else reclassified
    from its mask once. Kept on the block mask."""
    cached = getattr(mask, "_flex_kinds", None)
    if cached is not None:
        return cached
    block_q, block_k = mask.block_size
    if (block_q, block_k) == (BLOCK, BLOCK):
        kinds = mask.kinds
    elif BLOCK % block_q == 0 and BLOCK % block_k == 0:
        rq, rk = BLOCK // block_q, BLOCK // block_k
        B, H, nq, nk = mask.kinds.shape
        grid = F.pad(mask.kinds, (0, -nk % rk, 0, -nq % rq), value=-1)  # -1: no tile there
        grid = grid.view(B, H, grid.shape[2] // rq, rq, grid.shape[3] // rk, rk)
        present = grid >= 0
        nonempty = ((grid != EMPTY) & present).any(dim=5).any(dim=3)
        full = ((grid == FULL) | ~present).all(dim=5).all(dim=3)
        kinds = kinds_of(nonempty, full)
    else:
        # One source for the copy: the dense mask where one is cached (to_dense() keeps it beside the
        # mask_mod), else the mask_mod.
        copy = BlockMask(torch.empty(0, device=mask.device), mask.shape, (BLOCK, BLOCK),
                         mask_mod=None if mask._dense is not None else mask.mask_mod, dense=mask._dense)
        kinds = _classify(copy)
    mask._flex_kinds = kinds
    return kinds


def _structural_kinds(problem: Problem, Lp: int, Sp: int, device) -> Tensor | None:
    if not problem.structured:
        return None
    hi = problem.offset
    lo = None if problem.window is None else problem.offset - problem.window + 1
    return band_kinds(Lp, Sp, (BLOCK, BLOCK), lo, hi, device)


def _padding_kinds(L: int, S: int, Lp: int, Sp: int, device) -> Tensor | None:
    """Tiles of padded keys: empty beyond S, partial where a tile straddles S. Padded query rows need
    no masking (their outputs are dropped) but tiles of padded rows only are empty."""
    if (Lp, Sp) == (L, S):
        return None
    num_q, num_k = -(-Lp // BLOCK), -(-Sp // BLOCK)
    columns = torch.full((num_k,), FULL, dtype=torch.int8, device=device)
    columns[S // BLOCK:] = EMPTY
    if S % BLOCK:
        columns[S // BLOCK] = PARTIAL
    rows = torch.full((num_q, 1), FULL, dtype=torch.int8, device=device)
    rows[-(-L // BLOCK):] = EMPTY
    return torch.minimum(rows, columns[None, :])[None, None]


def _combine(parts: list[Tensor], num_q: int, num_k: int, device) -> Tensor:
    if not parts:
        return torch.full((1, 1, num_q, num_k), FULL, dtype=torch.int8, device=device)
    kinds = parts[0]
    for part in parts[1:]:  # min over EMPTY 0 < PARTIAL 1 < FULL 2: empty if any is, full if all are
        kinds = torch.minimum(kinds, part)
    return kinds.contiguous()


def _ordered(flags: Tensor) -> tuple[Tensor, Tensor]:
    """torch's table format: per row the count of True tiles (int32) and their column indices first,
    ascending (int32, the rest of the row unspecified). Sorted a band of rows at a time."""
    counts = flags.sum(dim=-1, dtype=torch.int32)
    indices = torch.empty(flags.shape, dtype=torch.int32, device=flags.device)
    rows = max(1, BAND_TILES // max(1, flags.shape[-1]))
    flat_flags, flat_indices = flags.flatten(0, -2), indices.view(-1, flags.shape[-1])
    for r0 in range(0, flat_flags.shape[0], rows):
        chunk = (~flat_flags[r0:r0 + rows]).to(torch.uint8)  # 0 for True: stable sort puts them first
        flat_indices[r0:r0 + rows] = torch.argsort(chunk, dim=-1, stable=True).to(torch.int32)
    return counts, indices


def _ragged_edges_partial(kinds: Tensor, seq_lengths: tuple[int, int]) -> Tensor:
    """A last row or column of tiles cut short by the length holds no full tile, as in torch's own
    ``create_block_mask`` (its kernel then masks positions past the length itself)."""
    L, S = seq_lengths
    if L % BLOCK == 0 and S % BLOCK == 0:
        return kinds
    kinds = kinds.clone()
    if L % BLOCK:
        kinds[..., -1, :].masked_fill_(kinds[..., -1, :] == FULL, PARTIAL)
    if S % BLOCK:
        kinds[..., -1].masked_fill_(kinds[..., -1] == FULL, PARTIAL)
    return kinds


def tables(kinds: Tensor, seq_lengths: tuple[int, int]) -> dict[str, Tensor]:
    """torch's eight tables from attnkit kinds: partial tiles in ``kv_indices``, full ones in
    ``full_kv_indices``, and the transposed tables for the backward pass, all from the one table."""
    kinds = _ragged_edges_partial(kinds, seq_lengths)
    partial, full = kinds == PARTIAL, kinds == FULL
    tables = {}
    for prefix, flags in (("", partial), ("full_", full)):
        tables[f"{prefix}kv_num_blocks"], tables[f"{prefix}kv_indices"] = _ordered(flags)
        tables[f"{prefix}q_num_blocks"], tables[f"{prefix}q_indices"] = _ordered(flags.transpose(-1, -2))
    return tables


def call_kinds(problem: Problem, L: int, S: int, Lp: int, Sp: int, device) -> Tensor:
    """One call's kinds on BLOCK x BLOCK tiles of its padded (Lp, Sp) lengths: the structure, the
    padding, a boolean mask and a block mask combined tile by tile (empty if any is, full if all are)."""
    num_q, num_k = -(-Lp // BLOCK), -(-Sp // BLOCK)
    parts = [x for x in (_structural_kinds(problem, Lp, Sp, device), _padding_kinds(L, S, Lp, Sp, device))
             if x is not None]
    if problem.mask is not None:
        mask = problem.mask[None, None] if problem.mask.dim() == 2 else problem.mask
        mask = mask.expand(*mask.shape[:2], L, S)
        parts.append(_pad_kinds(BlockMask.from_dense(mask, BLOCK).kinds, num_q, num_k))
    if problem.block_mask is not None:
        parts.append(_pad_kinds(tile_kinds(problem.block_mask), num_q, num_k))
    return _combine(parts, num_q, num_k, device)


TABLE_CACHE = 64
"""Converted tables, and prepared calls (their scalars and torch BlockMask), kept for calls without a
boolean mask (the structure alone, or a BlockMask, at one bucket): the layers of a model, and the
steps of a training loop, convert and prepare once."""
_structure_tables: OrderedDict = OrderedDict()


def cached(problem: Problem, key: tuple, build):
    """What ``build`` makes for ``key``, from the block mask's own cache (or the structure's, a bounded
    LRU): the tables of a pattern, and the prepared call."""
    owner = problem.block_mask
    cache = _structure_tables if owner is None else owner.__dict__.setdefault("_flex_tables", {})
    found = cache.get(key)
    if found is None:
        found = cache[key] = build()
        if owner is None and len(cache) > TABLE_CACHE:
            cache.popitem(last=False)
    elif owner is None:
        cache.move_to_end(key)
    return found


# ------------------------------------------------------------------------ torch's BlockMask both ways
def _scattered(counts: Tensor, indices: Tensor, kind: int, num_q: int, num_k: int) -> Tensor:
    """(B, H, num_q, num_k) int8: ``kind`` at the first ``counts`` column indices of each row of
    torch's table, EMPTY elsewhere (rows or columns beyond the lengths dropped)."""
    B, H, rows, width = indices.shape
    listed = torch.arange(width, device=indices.device) < counts[..., None].to(torch.long)
    columns = torch.where(listed & (indices >= 0) & (indices < num_k), indices.to(torch.long), num_k)
    table = torch.zeros(B, H, max(rows, num_q), num_k + 1, dtype=torch.int8, device=indices.device)
    table[:, :, :rows].scatter_(-1, columns, kind)
    return table[:, :, :num_q, :num_k]


def kinds_from_torch(mask) -> Tensor:
    """attnkit kinds (B, H, nQ, nK) on the torch block mask's own tiles: its partial tiles
    (``kv_indices``) PARTIAL, its full ones (``full_kv_indices``) FULL, every unlisted tile EMPTY."""
    L, S = mask.seq_lengths
    block_q, block_k = _pair(mask.BLOCK_SIZE)
    num_q, num_k = -(-L // block_q), -(-S // block_k)
    kinds = _scattered(mask.kv_num_blocks, mask.kv_indices, PARTIAL, num_q, num_k)
    if mask.full_kv_num_blocks is not None:
        kinds = torch.maximum(kinds, _scattered(mask.full_kv_num_blocks, mask.full_kv_indices, FULL, num_q, num_k))
    return kinds.contiguous()


def _pair(block) -> tuple[int, int]:
    return (int(block), int(block)) if isinstance(block, int) else (int(block[0]), int(block[1]))


def tiled_mask_mod(kinds: Tensor, block_size: tuple[int, int], mask_mod):
    """A mask_mod that means what FlexAttention makes of a block mask: a FULL tile allows everything
    (its mask_mod is never called there), an EMPTY one nothing, a PARTIAL one what ``mask_mod`` says.
    A block mask built from tables by hand (``BlockMask.from_kv_blocks`` with the default
    ``noop_mask``) is thus the same mask in attnkit's dense backends as in flex_attention."""
    block_q, block_k = block_size
    one_b, one_h = kinds.shape[0] == 1, kinds.shape[1] == 1

    def mod(b, h, q_idx, kv_idx):
        kind = kinds[0 if one_b else b, 0 if one_h else h, q_idx // block_q, kv_idx // block_k]
        return (kind == FULL) | ((kind == PARTIAL) & mask_mod(b, h, q_idx, kv_idx))

    mod.__name__ = f"tiled({getattr(mask_mod, '__name__', 'mask_mod')})"
    return mod


def clamped_mask_mod(mask_mod, L: int, S: int):
    """``mask_mod`` with query and key indices clamped into [0, L) and [0, S): torch's kernels may
    evaluate a ragged last tile past the lengths (and mask those positions themselves), where an
    attnkit mask_mod's tables end."""
    last_q, last_k = max(0, L - 1), max(0, S - 1)

    def mod(b, h, q_idx, kv_idx):
        return mask_mod(b, h, torch.clamp(q_idx, max=last_q), torch.clamp(kv_idx, max=last_k))

    mod.__name__ = getattr(mask_mod, "__name__", "mask_mod")
    return mod
