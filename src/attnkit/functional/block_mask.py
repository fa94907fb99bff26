"""Block-sparse masks from a mask function: which (query block, key block) tiles hold any work.

A ``mask_mod(b, h, q_idx, kv_idx) -> bool`` has FlexAttention's semantics (True = may attend).
attnkit calls it on *broadcast index tiles* (b of shape (B, 1, 1, 1), h (1, H, 1, 1), q_idx
(1, 1, bq, 1), kv_idx (1, 1, 1, bk)), so any function written with tensor operations (no Python
``if`` on values) works unchanged, and the whole L x S matrix is never built at once.

:class:`BlockMask` sorts every tile into one of three kinds:

- **empty**: nothing allowed; the tiled backend never computes it (forward or backward);
- **full**: everything allowed; computed with no mask work;
- **partial**: the mask is evaluated for that tile only.

The reference and SDPA backends materialise the mask (:meth:`BlockMask.to_dense`). torch's own FlexAttention
BlockMask converts to and from this one in :mod:`.torch_block_mask`, above both this type and the flex backend.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from .checks import check_int
from .tracing import may_keep

__all__ = ["BlockMask", "MaskMod", "ScoreMod", "block_mask", "index_grids", "length_bucket", "EMPTY", "PARTIAL", "FULL",
           "DEFAULT_BLOCK"]

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
"""``mask_mod(b, h, q_idx, kv_idx) -> bool tensor`` broadcastable to the index tiles' shape."""
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
"""``score_mod(score, b, h, q_idx, kv_idx) -> score`` of the same shape (ALiBi, softcapping)."""

EMPTY, PARTIAL, FULL = 0, 1, 2
DEFAULT_BLOCK = 128
"""Tile side, as FlexAttention's default; the tiled backend takes queries in blocks of this size."""
TILE_ELEMENTS = 1 << 24
"""Most mask entries evaluated at once while classifying tiles (16 MiB of booleans)."""
CACHE_ELEMENTS = 1 << 24
"""Most entries of partial tiles a block mask keeps (16M: 64 MiB in float32): the tiled backend
evaluates a partial run's mask once and reuses it in every later forward and backward pass."""
INDEX_DTYPE = torch.int32
"""Index tensors given to mask_mod and score_mod are int32, as FlexAttention's."""


def index_grids(B: int, H: int, q0: int, q1: int, k0: int, k1: int,
                device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """FlexAttention's broadcast index tensors of the tile of rows [q0, q1) and keys [k0, k1), as a mask_mod or a
    score_mod receives them: b (B, 1, 1, 1), h (1, H, 1, 1), q_idx (1, 1, q1 - q0, 1), kv_idx (1, 1, 1, k1 - k0),
    int32. Fresh tensors every call (a mod may keep them, or write into them), copied from ones built once per
    tile and kept (:func:`_kept_grids`): four copies cost half of four ``arange`` and four ``view`` calls (7
    against 14 us: benchmarks/overhead.py). Built afresh where
    nothing may be kept (:func:`.tracing.may_keep`: compiling or exporting, a fake tensor mode or a proxy tracer,
    whose tensors are never kept, and CUDA-graph capture, where kernels are recorded, not run)."""
    if not may_keep(device):
        return _grids(B, H, q0, q1, k0, k1, device)
    b, h, q_idx, kv_idx = _kept_grids(B, H, q0, q1, k0, k1, device)
    return b.clone(), h.clone(), q_idx.clone(), kv_idx.clone()


def _grids(B: int, H: int, q0: int, q1: int, k0: int, k1: int, device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    b = torch.arange(B, device=device, dtype=INDEX_DTYPE).view(B, 1, 1, 1)
    h = torch.arange(H, device=device, dtype=INDEX_DTYPE).view(1, H, 1, 1)
    q_idx = torch.arange(q0, q1, device=device, dtype=INDEX_DTYPE).view(1, 1, q1 - q0, 1)
    kv_idx = torch.arange(k0, k1, device=device, dtype=INDEX_DTYPE).view(1, 1, 1, k1 - k0)
    return b, h, q_idx, kv_idx


@functools.lru_cache(maxsize=256)
def _kept_grids(B: int, H: int, q0: int, q1: int, k0: int, k1: int, device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The index tensors of a tile, built once (a bounded LRU: 256 tiles, a few KiB each on the tiled backend's
    tiles) outside inference mode, so that their copies are ordinary tensors wherever a call runs. Never handed
    out: :func:`index_grids` gives copies."""
    with torch.inference_mode(False):
        return _grids(B, H, q0, q1, k0, k1, device)


def length_bucket(n: int) -> int:
    """The length a compiled kernel is specialised for when a call has length ``n``: powers of two
    up to 512, then multiples of a quarter of the octave (513 -> 640, 1000 -> 1024, 5000 -> 5120).
    At most 25% of padding beyond 512 (whose tiles the kernel skips), four buckets per doubling.
    The flex backend pads lengths to it; mask_mods pad the tables they close over to it."""
    if n <= 512:
        return max(1, 1 << (n - 1).bit_length())
    step = (1 << (n.bit_length() - 1)) // 4
    return -(-n // step) * step


def _positive(name: str, value) -> int:
    return check_int(name, value, 1)


def _broadcast_size(name: str, value) -> int:
    if value is None:
        return 1
    return _positive(name, value)


class BlockMask:
    """A boolean mask (B|1, H|1, L, S) described tile by tile, with the mask itself on demand.

    Build one with :func:`block_mask` (from a ``mask_mod``) or :meth:`from_dense` (from a boolean
    tensor). Pass it as ``attention(..., mask=block_mask)``; ``B`` and ``H`` of 1 broadcast over
    the batch and the heads.

    Attributes:
        kinds: (B|1, H|1, num_q_blocks, num_k_blocks) int8, EMPTY / PARTIAL / FULL per tile.
        shape: (B|1, H|1, L, S).
        block_size: (block_q, block_k).
    """

    def __init__(
        self,
        kinds: Tensor,
        shape: tuple[int, int, int, int],
        block_size: tuple[int, int],
        *,
        mask_mod: MaskMod | None = None,
        dense: Tensor | None = None,
    ):
        if (mask_mod is None) == (dense is None):
            raise ValueError("BlockMask needs exactly one of mask_mod and dense")
        self.kinds = kinds
        self.shape: tuple[int, int, int, int] = (shape[0], shape[1], shape[2], shape[3])
        self.block_size: tuple[int, int] = (block_size[0], block_size[1])
        self.mask_mod = mask_mod
        self._dense = dense
        self._flex_kinds: Tensor | None = None  # the flex backend's tile table, once built
        self._runs: dict[int, list[list[tuple[int, int, bool]]]] = {}
        self._additive: dict[tuple, Tensor] = {}
        self._cached = 0
        self._torch = None  # the torch BlockMask this one was converted from (torch_block_mask.from_torch)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dense(cls, mask: Tensor, block: int | tuple[int, int] = DEFAULT_BLOCK) -> BlockMask:
        """A block mask from a boolean tensor (L, S) or (B|1, H|1, L, S) (True = may attend)."""
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
            raise TypeError(f"mask must be a boolean tensor, got {got}")
        if mask.dim() == 2:
            mask = mask[None, None]
        if mask.dim() != 4:
            raise ValueError(f"mask must have shape (L, S) or (B|1, H|1, L, S), got {tuple(mask.shape)}")
        block_q, block_k = _block_sizes(block)
        B, H, L, S = mask.shape
        result = cls(torch.empty(0), (B, H, L, S), (block_q, block_k), dense=mask)
        result.kinds = _classify(result)
        return result

    # ------------------------------------------------------------------ sizes
    @property
    def num_blocks(self) -> tuple[int, int]:
        """(query blocks, key blocks)."""
        L, S = self.shape[2], self.shape[3]
        return -(-L // self.block_size[0]), -(-S // self.block_size[1])

    @property
    def device(self) -> torch.device:
        return self.kinds.device

    def occupancy(self) -> float:
        """Fraction of tiles that some (batch, head) must compute: the work relative to dense. Counted
        once per tile table (``auto`` asks on every call)."""
        kinds = self.kinds
        cached = self.__dict__.get("_occupancy")
        if cached is not None and cached[0] is kinds:
            return cached[1]
        if kinds.numel() == 0:
            share = 0.0
        else:
            nonempty = _merged_kinds(kinds) != EMPTY
            share = int(torch.count_nonzero(nonempty)) / nonempty.numel()
        self._occupancy = (kinds, share)
        return share

    def counts(self) -> dict[str, int]:
        """Tiles of each kind over all (batch, head) entries."""
        return {name: int(torch.count_nonzero(self.kinds == kind)) for name, kind in (("empty", EMPTY), ("partial", PARTIAL), ("full", FULL))}

    def __repr__(self) -> str:
        counts = ", ".join(f"{k}={v}" for k, v in self.counts().items())
        return (f"BlockMask(shape={self.shape}, block_size={self.block_size}, {counts}, "
                f"occupancy={self.occupancy():.3f})")

    # ------------------------------------------------------------------ the mask itself
    def tile(self, q0: int, q1: int, k0: int, k1: int) -> Tensor:
        """The mask of rows [q0, q1) and keys [k0, k1): (B|1, H|1, q1-q0, k1-k0) boolean."""
        B, H = self.shape[0], self.shape[1]
        if self._dense is not None:
            return self._dense[..., q0:q1, k0:k1]
        b, h, q_idx, kv_idx = index_grids(B, H, q0, q1, k0, k1, self.device)
        assert self.mask_mod is not None  # a dense BlockMask has no partial tiles to evaluate
        out = self.mask_mod(b, h, q_idx, kv_idx)
        if not isinstance(out, Tensor) or out.dtype != torch.bool:
            got = out.dtype if isinstance(out, Tensor) else type(out).__name__
            raise TypeError(f"mask_mod must return a boolean tensor, got {got}")
        target = (B, H, q1 - q0, k1 - k0)
        try:
            return out.expand(target)
        except RuntimeError as error:
            raise ValueError(
                f"mask_mod returned shape {tuple(out.shape)}, which does not broadcast to the tile "
                f"(B|1, H|1, bq, bk) = {target}; index tensors arrive as b (B,1,1,1), h (1,H,1,1), "
                "q_idx (1,1,bq,1), kv_idx (1,1,1,bk)"
            ) from error

    def additive(self, q0: int, q1: int, k0: int, k1: int, dtype: torch.dtype) -> Tensor:
        """The tile as an additive mask (0 where allowed, -inf where masked), kept for reuse while
        the cache has room. Adding it costs a tenth of ``masked_fill`` with a broadcast boolean
        tile on CPU (27 vs 280 us for 8 x 128 x 256 scores)."""
        key = (q0, q1, k0, k1, dtype)
        found = self._additive.get(key)
        if found is not None:
            return found
        tile = self.tile(q0, q1, k0, k1)
        additive = torch.zeros(tile.shape, dtype=dtype, device=tile.device).masked_fill_(~tile, float("-inf"))
        if self._cached + additive.numel() <= CACHE_ELEMENTS:
            self._additive[key] = additive
            self._cached += additive.numel()
        return additive

    def to_dense(self) -> Tensor:
        """The whole mask (B|1, H|1, L, S); O(L x S) memory (the reference and SDPA backends)."""
        if self._dense is not None:
            return self._dense
        B, H, L, S = self.shape
        out = torch.zeros(B, H, L, S, dtype=torch.bool, device=self.device)
        rows = max(1, TILE_ELEMENTS // max(1, B * H * S))
        for q0 in range(0, L, rows):
            out[:, :, q0 : q0 + rows] = self.tile(q0, min(L, q0 + rows), 0, S)
        if out.numel() <= CACHE_ELEMENTS and may_keep(self.device):  # SDPA and reference calls reuse it (not a
            self._dense = out  # fake or traced one: exported, compiled, under a fake tensor mode)
        return out

    # ------------------------------------------------------------------ iteration for the tiled backend
    def runs(self, max_blocks: int) -> list[list[tuple[int, int, bool]]]:
        """Per query block, the key ranges to compute: (k0, k1, partial) for runs of tiles of one
        kind (non-empty for some batch/head; full only if full for all), at most ``max_blocks``
        tiles wide. Computed once per block mask and width."""
        if max_blocks not in self._runs:
            self._runs[max_blocks] = _runs(self, max_blocks)
        return self._runs[max_blocks]


def _block_sizes(block) -> tuple[int, int]:
    if isinstance(block, tuple):
        if len(block) != 2:
            raise ValueError(f"block must be an int or a pair (block_q, block_k), got {block!r}")
        return _positive("block_q", block[0]), _positive("block_k", block[1])
    size = _positive("block", block)
    return size, size


def _classify(mask: BlockMask) -> Tensor:
    """(B|1, H|1, nQ, nK) kinds, evaluating the mask a band of query blocks at a time."""
    B, H, L, S = mask.shape
    block_q, block_k = mask.block_size
    num_q, num_k = mask.num_blocks
    device = mask._dense.device if mask._dense is not None else mask.kinds.device
    kinds = torch.empty(B, H, num_q, num_k, dtype=torch.int8, device=device)
    pad = num_k * block_k - S
    band = max(1, TILE_ELEMENTS // max(1, B * H * block_q * S))  # query blocks per evaluation
    for i0 in range(0, num_q, band):
        i1 = min(num_q, i0 + band)
        q0, q1 = i0 * block_q, min(L, i1 * block_q)
        t = mask.tile(q0, q1, 0, S)  # (B, H, rows, S)
        rows_pad = (i1 - i0) * block_q - (q1 - q0)
        # Padding rows and keys: False for "any", True for "all", so they change neither.
        if pad or rows_pad:
            any_t = torch.nn.functional.pad(t, (0, pad, 0, rows_pad), value=False)
            all_t = torch.nn.functional.pad(t, (0, pad, 0, rows_pad), value=True)
        else:  # whole tiles: no padded copies (a third of the time at 64K)
            any_t = all_t = t.contiguous()
        shape = (B, H, i1 - i0, block_q, num_k, block_k)
        some = any_t.reshape(shape).any(dim=5).any(dim=3)
        every = all_t.reshape(shape).all(dim=5).all(dim=3)
        kinds[:, :, i0:i1] = kinds_of(some, every)
    return kinds


def kinds_of(nonempty: Tensor, full: Tensor) -> Tensor:
    """int8 kinds from two boolean grids of tiles: EMPTY (0) where not non-empty, FULL (2) where full
    and non-empty, PARTIAL (1) otherwise. Every builder of kinds from reductions ends here."""
    return nonempty.to(torch.int8) + (full & nonempty).to(torch.int8)


def _merged_kinds(kinds: Tensor) -> Tensor:
    """(nQ, nK) int8 kinds over all (batch, head) entries: non-empty if non-empty for some, full only
    if full for all."""
    if kinds.shape[0] * kinds.shape[1] == 1:
        return kinds[0, 0]
    return kinds_of((kinds != EMPTY).any(dim=1).any(dim=0), (kinds == FULL).all(dim=1).all(dim=0))


def _runs(mask: BlockMask, max_blocks: int) -> list[list[tuple[int, int, bool]]]:
    S = mask.shape[3]
    block_k = mask.block_size[1]
    kind = _merged_kinds(mask.kinds).cpu()  # (nQ, nK)
    num_q, num_k = kind.shape
    # A run starts where the kind changes along the key axis (or at column 0); it ends where the
    # next one in its row starts. Only the starts go to Python (a million-token mask has 64M tiles).
    change = torch.ones_like(kind, dtype=torch.bool)
    change[:, 1:] = kind[:, 1:] != kind[:, :-1]
    rows, cols = change.nonzero(as_tuple=True)
    ends = torch.full_like(cols, num_k)
    same_row = rows[1:] == rows[:-1]
    ends[:-1] = torch.where(same_row, cols[1:], num_k)
    values = kind[rows, cols]
    keep = values != EMPTY
    result: list[list[tuple[int, int, bool]]] = [[] for _ in range(num_q)]
    for row, a, b, k in zip(rows[keep].tolist(), cols[keep].tolist(), ends[keep].tolist(), values[keep].tolist()):
        runs = result[row]
        for c in range(a, b, max_blocks):
            runs.append((c * block_k, min(S, min(b, c + max_blocks) * block_k), k == PARTIAL))
    return result


def block_mask(
    mask_mod: MaskMod,
    B: int | None,
    H: int | None,
    L: int,
    S: int,
    *,
    block: int | tuple[int, int] = DEFAULT_BLOCK,
    device: torch.device | str | None = None,
) -> BlockMask:
    """A :class:`BlockMask` from ``mask_mod(b, h, q_idx, kv_idx) -> bool`` (FlexAttention's
    ``create_block_mask``). ``B`` / ``H`` of None mean the mask is the same for every example /
    head. The mask is evaluated a band of query blocks at a time, never on all of L x S at once.
    """
    if not callable(mask_mod):
        raise TypeError(f"mask_mod must be callable (b, h, q_idx, kv_idx) -> bool tensor, got {type(mask_mod).__name__}")
    B = _broadcast_size("B", B)
    H = _broadcast_size("H", H)
    for name, n in (("L", L), ("S", S)):
        check_int(name, n, 0)
    positions = getattr(mask_mod, "positions", None)
    if positions is not None and max(L, S) > positions:
        raise ValueError(
            f"{getattr(mask_mod, '__name__', 'mask_mod')} reads tables of {positions} positions but the block "
            f"mask has L={L}, S={S}; build the mask_mod from tables of the sequence's length"
        )
    block_q, block_k = _block_sizes(block)
    device = torch.device("cpu") if device is None else torch.device(device)
    result = BlockMask(torch.empty(0, device=device), (B, H, L, S), (block_q, block_k), mask_mod=mask_mod)
    result.kinds = _classify(result)
    return result
