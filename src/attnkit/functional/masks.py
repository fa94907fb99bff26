"""Boolean attention masks. **True means "may attend"** (PyTorch SDPA's convention). The public home
of these names, with a smaller ``__all__``, is :mod:`attnkit.masks`; this module is its implementation.

Every function returns a mask already shaped for :func:`attnkit.attention`: ``(L, S)`` for masks
that are the same for the whole batch, ``(B, 1, 1, S)`` for key padding and ``(B, 1, L, S)`` for
per-example query masks. Combine them with :func:`and_masks` / :func:`or_masks`.

Causal alignment when L != S:

- ``"top-left"`` (like ``is_causal`` in PyTorch): query i may attend keys j <= i.
- ``"bottom-right"`` (KV-cache decoding, the last query sees the last key): query i may attend
  keys j <= i + (S - L).

Sparse patterns beyond one mask tensor are ``mask_mod(b, h, q_idx, kv_idx) -> bool`` functions
(FlexAttention's semantics), turned into a :class:`BlockMask` by :func:`block_mask` so that the
tiled backend skips the tiles they rule out: :func:`window_mod` (two-sided, encoders),
:func:`longformer_mod`, :func:`bigbird_mod`, :func:`prefix_lm_mod`, :func:`document_mod` (packed
sequences), :func:`dilated_window_mod`, :func:`sinks_window_mod` (StreamingLLM), combined with
:func:`and_masks` / :func:`or_masks` (on mask_mods); :func:`attnkit.masks.pattern_block_mask` builds one by name
(:mod:`attnkit.functional.block_patterns`).

Shape legend: B batch, H heads, L query length, S key length.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._deprecated import UNSET, alias, renamed
from .block_mask import BlockMask, MaskMod, ScoreMod, block_mask
from .checks import check_int
from .mask_mods import (
    ALIGNMENTS,
    PATTERNS,
    _combine_mods,
    bigbird_mod,
    causal_mod,
    causal_offset,
    dilated_window_mod,
    document_mod,
    longformer_mod,
    padding_mod,
    prefix_lm_mod,
    real_tokens_mod,
    sinks_window_mod,
    window_mod,
)

__all__ = [
    "ALIGNMENTS",
    "causal_offset",
    "causal_block",
    "causal_positions",
    "causal",
    "sliding_window",
    "padding",
    "local",
    "and_masks",
    "or_masks",
    "from_key_padding_mask",
    "from_additive",
    "selected",
    "BlockMask",
    "MaskMod",
    "ScoreMod",
    "block_mask",
    "causal_mod",
    "padding_mod",
    "real_tokens_mod",
    "window_mod",
    "longformer_mod",
    "bigbird_mod",
    "prefix_lm_mod",
    "document_mod",
    "dilated_window_mod",
    "sinks_window_mod",
    "and_mods",
    "or_mods",
    "PATTERNS",
]

def _check_length(name: str, n: int) -> None:
    check_int(name, n, 0)


def causal_block(
    q0: int, q1: int, k0: int, k1: int, offset: int, window: int | None = None, *, device=None
) -> Tensor:
    """(q1-q0, k1-k0) block of the causal (or causal sliding-window) mask with the given offset.

    Query i may attend key j iff ``j <= i + offset`` and, with a window, ``j > i + offset - window``.
    """
    return causal_positions(torch.arange(q0 + offset, q1 + offset, device=device),
                            torch.arange(k0, k1, device=device), window)


def mask_rows(mask: Tensor, r0: int, r1: int) -> Tensor:
    """Rows r0 .. r1-1 of a mask (..., L|1, S), for a block of queries: a mask of one row serves every query."""
    return mask if mask.shape[-2] == 1 else mask[..., r0:r1, :]


def causal_positions(query_positions: Tensor, key_positions: Tensor, window: int | None = None) -> Tensor:
    """(L, S) causal (or causal sliding-window) mask from the positions of the queries (L,) and of
    the keys (S,): a query at position p may attend a key at position k iff ``k <= p`` and, with a
    window, ``k > p - window``. The positions may be device tensors (a compiled decode step's cache
    columns, a ring shard's global positions); the comparison broadcasts a column against a row,
    never building an (L, S) integer matrix."""
    p, k = query_positions[:, None], key_positions[None, :]
    allowed = k <= p
    if window is not None:
        allowed &= k > p - window
    return allowed


def _whole_causal(L: int, S: int, causal_align: str, window: int | None, device) -> Tensor:
    _check_length("L", L)
    _check_length("S", S)
    return causal_block(0, L, 0, S, causal_offset(L, S, causal_align), window, device=device)


def causal(L: int, S: int | None = None, *, causal_align=UNSET, device=None, align=UNSET) -> Tensor:
    """(L, S) mask where query i may attend key j iff j <= i (+ S - L for ``causal_align="bottom-right"``;
    default top-left). ``align`` is the deprecated old name of ``causal_align``."""
    causal_align = renamed("masks.causal", "align", "causal_align", align, causal_align, "top-left")
    return _whole_causal(L, L if S is None else S, causal_align, None, device)


def sliding_window(
    L: int, S: int | None = None, window: int = 256, *, causal_align=UNSET, device=None, align=UNSET
) -> Tensor:
    """(L, S) causal sliding-window mask (Mistral's sliding window).

    Query i may attend the ``window`` most recent keys up to its aligned position:
    ``i + offset - window < j <= i + offset``. ``window >= S`` gives the plain causal mask.
    ``align`` is the deprecated old name of ``causal_align`` (default top-left).
    """
    causal_align = renamed("masks.sliding_window", "align", "causal_align", align, causal_align, "top-left")
    check_int("window", window, 1)
    return _whole_causal(L, L if S is None else S, causal_align, window, device)


def padding(lengths: Tensor, S: int) -> Tensor:
    """(B, 1, 1, S) mask where example b may attend its first ``lengths[b]`` keys."""
    if not isinstance(lengths, Tensor) or lengths.dim() != 1:
        shape = tuple(lengths.shape) if isinstance(lengths, Tensor) else type(lengths).__name__
        raise ValueError(f"lengths must be a 1-D tensor of shape (B,), got {shape}")
    if lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise TypeError(f"lengths must be an integer tensor, got dtype {lengths.dtype}")
    _check_length("S", S)
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > S):
        raise ValueError(
            f"lengths must lie in [0, S={S}], got values in [{int(lengths.min())}, {int(lengths.max())}]"
        )
    j = torch.arange(S, device=lengths.device)
    return (j[None, :] < lengths[:, None])[:, None, None, :]


def local(L: int, S: int, centers: Tensor, width: int) -> Tensor:
    """Luong et al. (2015) local-attention window: query i may attend keys |j - centers[i]| <= width.

    Args:
        centers: (L,) or (B, L) window centres (integer or real positions p_t).
        width: half-width D of the window [p_t - D, p_t + D].

    Returns:
        (L, S) for (L,) centres, (B, 1, L, S) for (B, L) centres.
    """
    _check_length("width", width)
    _check_length("S", S)
    if not isinstance(centers, Tensor) or centers.dim() not in (1, 2) or centers.shape[-1] != L:
        shape = tuple(centers.shape) if isinstance(centers, Tensor) else type(centers).__name__
        raise ValueError(f"centers must have shape (L,) or (B, L) with L={L}, got {shape}")
    j = torch.arange(S, device=centers.device)
    mask = (j - centers[..., None]).abs() <= width  # (..., L, S)
    return mask if centers.dim() == 1 else mask[:, None]


def _combine(op, masks: tuple[Tensor, ...], name: str) -> Tensor:
    if not masks:
        raise ValueError(f"{name} needs at least one mask")
    for index, m in enumerate(masks):
        if not isinstance(m, Tensor) or m.dtype != torch.bool:
            got = m.dtype if isinstance(m, Tensor) else type(m).__name__
            raise TypeError(f"{name}: takes boolean tensors or mask_mods (all of one kind); mask {index} is {got}")
    try:
        shape = torch.broadcast_shapes(*(m.shape for m in masks))
    except RuntimeError as error:
        shapes = ", ".join(str(tuple(m.shape)) for m in masks)
        raise ValueError(f"{name}: masks of shapes {shapes} do not broadcast together") from error
    out = masks[0].expand(shape)
    for m in masks[1:]:
        out = op(out, m)
    return out.contiguous()


def and_masks(*masks):
    """A key is allowed iff every mask allows it. Boolean tensors give a tensor (e.g. causal and
    padding, broadcast together); mask_mods give a mask_mod, as FlexAttention's ``and_masks`` does
    (e.g. a pattern and key padding)."""
    if masks and all(callable(m) for m in masks):
        return _combine_mods(masks, "and_masks", torch.logical_and)
    return _combine(torch.logical_and, masks, "and_masks")


def or_masks(*masks):
    """A key is allowed iff some mask allows it (e.g. a window or a global token): boolean tensors
    give a tensor, mask_mods a mask_mod (FlexAttention's ``or_masks``)."""
    if masks and all(callable(m) for m in masks):
        return _combine_mods(masks, "or_masks", torch.logical_or)
    return _combine(torch.logical_or, masks, "or_masks")


def from_key_padding_mask(key_padding_mask: Tensor) -> Tensor:
    """Convert ``nn.MultiheadAttention``'s key_padding_mask (B, S), True = ignore, to (B, 1, 1, S)."""
    if not isinstance(key_padding_mask, Tensor) or key_padding_mask.dim() != 2:
        shape = (
            tuple(key_padding_mask.shape)
            if isinstance(key_padding_mask, Tensor)
            else type(key_padding_mask).__name__
        )
        raise ValueError(f"key_padding_mask must have shape (B, S), got {shape}")
    if key_padding_mask.dtype != torch.bool:
        raise TypeError(
            f"key_padding_mask must be boolean (True = ignore), got dtype {key_padding_mask.dtype}; "
            "use from_additive for float masks"
        )
    return ~key_padding_mask[:, None, None, :]


def from_additive(additive_mask: Tensor) -> Tensor:
    """Convert an additive float mask (0 = attend, -inf or a huge negative = masked) to boolean.

    Raises ``ValueError`` if the mask holds other values: those are a bias, not a mask; pass
    them to :func:`attnkit.attention` as ``bias=`` instead.
    """
    if not isinstance(additive_mask, Tensor) or not additive_mask.is_floating_point():
        got = additive_mask.dtype if isinstance(additive_mask, Tensor) else type(additive_mask).__name__
        raise TypeError(f"additive_mask must be a float tensor, got {got}")
    blocked = additive_mask <= torch.finfo(additive_mask.dtype).min / 2
    allowed = additive_mask == 0
    bad = ~(blocked | allowed)
    if bool(bad.any()):
        example = additive_mask[bad][0].item()
        raise ValueError(
            "additive_mask holds values other than 0 and -inf (e.g. "
            f"{example!r}); it is a bias, pass it to attention(..., bias=...) instead"
        )
    return allowed


def selected(indices: Tensor, S: int, *, block_size: int = 1, heads: int | None = None) -> Tensor:
    """The keys a sparse attention's selection lets each query attend, as a boolean mask.

    ``indices`` (B, L, k) or (B, Hs, L, k), integer: for query i of example b (and selection head h,
    one per group of H / Hs query heads) the keys (``block_size`` 1: DeepSeek-V3.2's top-k tokens) or
    the key blocks [j * block_size, (j + 1) * block_size) (MiniMax-M3's top-k blocks) it may attend.
    A negative entry is an empty slot; a repeated one counts once.

    Returns (B, 1, L, S) or (B, Hs, L, S), True at selected keys; with ``heads`` = H (a multiple of Hs),
    (B, H, L, S), query head h reading selection head h // (H / Hs) as grouped heads read key heads.
    Combine it with the call's other masks (:func:`and_masks`) and pass it as ``mask``."""
    check_int("block_size", block_size, 1)
    check_int("heads", heads, 1, optional=True)
    _check_length("S", S)
    if not isinstance(indices, Tensor) or indices.dim() not in (3, 4):
        got = tuple(indices.shape) if isinstance(indices, Tensor) else type(indices).__name__
        raise ValueError(f"indices must have shape (B, L, k) or (B, Hs, L, k), got {got}")
    if indices.is_floating_point() or indices.dtype == torch.bool:
        raise TypeError(f"indices must be an integer tensor of key (or key block) positions, got dtype {indices.dtype}")
    blocks = -(-S // block_size)
    if indices.numel() and int(indices.max()) >= blocks:
        what = "key" if block_size == 1 else f"key block (of {block_size} keys)"
        raise ValueError(f"indices must hold {what} positions in [0, {blocks}) or -1 for an empty slot, got "
                         f"{int(indices.max())} for S={S}")
    slots = indices.long().masked_fill(indices < 0, blocks)  # empty slots land in a column dropped below
    chosen = torch.zeros(*indices.shape[:-1], blocks + 1, dtype=torch.bool, device=indices.device)
    chosen.scatter_(-1, slots, True)
    chosen = chosen[..., :blocks]
    if block_size > 1:
        chosen = chosen.repeat_interleave(block_size, dim=-1)[..., :S]
    chosen = chosen[:, None] if indices.dim() == 3 else chosen
    if heads is None or chosen.shape[1] in (1, heads):
        return chosen
    if heads % chosen.shape[1]:
        raise ValueError(f"heads={heads} must be a multiple of the selection's {chosen.shape[1]} heads")
    return chosen.repeat_interleave(heads // chosen.shape[1], dim=1)


and_mods = alias(and_masks, "and_mods")  # deprecated: and_masks takes mask_mods (FlexAttention's name)
or_mods = alias(or_masks, "or_mods")  # deprecated: or_masks takes mask_mods
