"""Boolean attention masks. **True means "may attend"** (PyTorch SDPA's convention).

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
from .block_mask import BlockMask, MaskMod, ScoreMod, block_mask, length_bucket

__all__ = [
    "ALIGNMENTS",
    "causal_offset",
    "causal_block",
    "causal",
    "sliding_window",
    "padding",
    "local",
    "and_masks",
    "or_masks",
    "from_key_padding_mask",
    "from_additive",
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

ALIGNMENTS = ("top-left", "bottom-right")


def causal_offset(L: int, S: int, causal_align: str) -> int:
    """Key index that query 0 is aligned with: 0 for top-left, S - L for bottom-right."""
    if causal_align not in ALIGNMENTS:
        raise ValueError(f"causal_align must be one of {ALIGNMENTS}, got {causal_align!r}")
    return S - L if causal_align == "bottom-right" else 0


def _check_length(name: str, n: int) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"{name} must be a non-negative int, got {n!r}")


def causal_block(
    q0: int, q1: int, k0: int, k1: int, offset: int, window: int | None = None, *, device=None
) -> Tensor:
    """(q1-q0, k1-k0) block of the causal (or causal sliding-window) mask with the given offset.

    Query i may attend key j iff ``j <= i + offset`` and, with a window, ``j > i + offset - window``.
    The comparison broadcasts a column against a row, never building an (L, S) integer matrix.
    """
    aligned = torch.arange(q0 + offset, q1 + offset, device=device)[:, None]  # (bq, 1)
    keys = torch.arange(k0, k1, device=device)[None, :]  # (1, bk)
    allowed = keys <= aligned
    if window is not None:
        allowed &= keys > aligned - window
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
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ValueError(f"window must be a positive int, got {window!r}")
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


# ---------------------------------------------------------------------------------------------
# Sparse patterns as mask_mod functions. Each is evaluated on broadcast index tiles (see
# attnkit.functional.block_mask): b (B, 1, 1, 1), h (1, H, 1, 1), q_idx (1, 1, bq, 1),
# kv_idx (1, 1, 1, bk).


def _named(function: MaskMod, name: str, positions: int | None = None) -> MaskMod:
    """Name a mask_mod; ``positions``: the length of the tables it reads (``mod.positions``), beyond
    which :func:`block_mask` refuses it rather than read the tables' padding."""
    function.__name__ = function.__qualname__ = name
    function.positions = positions
    return function


def _non_negative(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return value


def _per_example(name: str, values, dtype_kind: str) -> Tensor:
    """A (B|1, N) tensor from an (N,) or (B, N) tensor of ints or booleans."""
    if not isinstance(values, Tensor) or values.dim() not in (1, 2):
        shape = tuple(values.shape) if isinstance(values, Tensor) else type(values).__name__
        raise ValueError(f"{name} must be a tensor of shape (L,) or (B, L), got {shape}")
    if dtype_kind == "bool" and values.dtype != torch.bool:
        raise TypeError(f"{name} must be a boolean tensor (True = global), got dtype {values.dtype}")
    if dtype_kind == "int" and (values.is_floating_point() or values.dtype == torch.bool):
        raise TypeError(f"{name} must be an integer tensor, got dtype {values.dtype}")
    return values if values.dim() == 2 else values[None]


def _captured(table: Tensor, fill) -> Tensor:
    """The (B|1, N) table a mask_mod closes over, padded along positions to ``length_bucket(N)`` with
    ``fill``. Indices never reach the padding (masks are evaluated within [0, L)); compiled
    FlexAttention sees one shape per bucket, so a new length in the same bucket does not recompile."""
    n = table.shape[-1]
    return torch.nn.functional.pad(table, (0, length_bucket(n) - n), value=fill)


def _take(table: Tensor, b: Tensor, index: Tensor, name: str) -> Tensor:
    """table[b, index] for a (B|1, N) table, broadcasting b (B, 1, 1, 1) against index tiles; also
    works on FlexAttention's scalar indices. A per-example table needs the block mask's B to match."""
    if table.shape[0] == 1:
        return table[0][index]
    if b.dim() and b.shape[0] != table.shape[0]:
        raise ValueError(
            f"{name} has {table.shape[0]} rows (one per example) but the block mask was built "
            f"with B={b.shape[0]}; pass B={table.shape[0]} to block_mask"
        )
    return table[b, index]


def causal_mod(offset: int = 0) -> MaskMod:
    """Causal: query i attends keys j <= i + offset (offset S - L aligns bottom-right)."""
    offset = int(offset)
    return _named(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx + offset, f"causal_mod(offset={offset})")


def padding_mod(lengths: Tensor) -> MaskMod:
    """Key padding: example b attends its first ``lengths[b]`` keys. lengths: (B,) integers."""
    if not isinstance(lengths, Tensor) or lengths.dim() != 1 or lengths.is_floating_point():
        got = (lengths.dtype, tuple(lengths.shape)) if isinstance(lengths, Tensor) else type(lengths).__name__
        raise ValueError(f"lengths must be an integer tensor of shape (B,), got {got}")
    table = lengths[:, None]

    def mod(b, h, q_idx, kv_idx):
        return kv_idx < _take(table, b, torch.zeros_like(q_idx), "lengths")

    return _named(mod, "padding_mod")


def real_tokens_mod(real: Tensor) -> MaskMod:
    """Padding anywhere (left, right, inside): query i and key j must both be real tokens, so a
    padding query attends nothing (zero output). real: (L,) or (B, L) boolean, True at real tokens."""
    table = _captured(_per_example("real", real, "bool"), False)

    def mod(b, h, q_idx, kv_idx):
        return _take(table, b, q_idx, "real") & _take(table, b, kv_idx, "real")

    return _named(mod, "real_tokens_mod", real.shape[-1])


def window_mod(window: int) -> MaskMod:
    """Two-sided sliding window for encoders: |i - j| <= window // 2 (``window`` is the whole
    width, as Longformer's ``attention_window``)."""
    radius = _non_negative("window", window) // 2
    return _named(lambda b, h, q_idx, kv_idx: (q_idx - kv_idx).abs() <= radius, f"window_mod({window})")


def longformer_mod(window: int, global_tokens: Tensor) -> MaskMod:
    """Longformer (Beltagy et al. 2020): a two-sided window of ``window`` (|i - j| <= window // 2)
    plus global tokens, which attend every key and which every query attends.

    Args:
        global_tokens: (L,) or (B, L) boolean, True at global positions (e.g. [CLS], the question).
    """
    local = window_mod(window)
    table = _captured(_per_example("global_tokens", global_tokens, "bool"), False)

    def mod(b, h, q_idx, kv_idx):
        return (local(b, h, q_idx, kv_idx) | _take(table, b, q_idx, "global_tokens")
                | _take(table, b, kv_idx, "global_tokens"))

    return _named(mod, f"longformer_mod(window={window})", global_tokens.shape[-1])


def bigbird_mod(
    L: int, S: int | None = None, *, window: int = 3, num_global: int = 1, random_blocks: int = 3,
    block: int = 64, seed: int = 0,
) -> MaskMod:
    """BigBird (Zaheer et al. 2020), in blocks of ``block`` tokens: ``num_global`` global blocks at
    the start (attend and attended by all), a window of ``window`` blocks centred on the query's
    block, and ``random_blocks`` key blocks per query block drawn with ``seed`` (the same for every
    example and head, reproducible)."""
    S = L if S is None else S
    for name, value in (("L", L), ("S", S), ("window", window), ("num_global", num_global),
                        ("random_blocks", random_blocks)):
        _non_negative(name, value)
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive int, got {block!r}")
    num_q, num_k = -(-L // block), -(-S // block)
    generator = torch.Generator().manual_seed(seed)
    chosen = torch.zeros(num_q, num_k, dtype=torch.bool)
    count = min(random_blocks, num_k)
    for row in range(num_q):
        chosen[row, torch.randperm(num_k, generator=generator)[:count]] = True
    radius = window // 2

    def mod(b, h, q_idx, kv_idx):
        qb, kb = q_idx // block, kv_idx // block
        table = chosen.to(q_idx.device)
        return ((qb - kb).abs() <= radius) | (qb < num_global) | (kb < num_global) | table[qb, kb]

    mod.random_table = chosen  # (query blocks, key blocks) True where a random block was drawn
    return _named(mod, f"bigbird_mod(window={window}, num_global={num_global}, random_blocks={random_blocks}, block={block}, seed={seed})")


def prefix_lm_mod(prefix_lengths: int | Tensor) -> MaskMod:
    """Prefix LM (T5, UniLM): keys of the prefix are visible to every query, the rest causally.
    ``prefix_lengths``: an int, or (B,) integers per example."""
    if isinstance(prefix_lengths, int) and not isinstance(prefix_lengths, bool):
        n = _non_negative("prefix_lengths", prefix_lengths)
        return _named(lambda b, h, q_idx, kv_idx: (kv_idx <= q_idx) | (kv_idx < n), f"prefix_lm_mod({n})")
    if not isinstance(prefix_lengths, Tensor) or prefix_lengths.dim() != 1 or prefix_lengths.is_floating_point():
        raise ValueError(f"prefix_lengths must be an int or an integer tensor (B,), got {prefix_lengths!r}")
    table = prefix_lengths[:, None]

    def mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) | (kv_idx < _take(table, b, torch.zeros_like(q_idx), "prefix_lengths"))

    return _named(mod, "prefix_lm_mod")


def document_mod(document_ids: Tensor, *, causal: bool = True) -> MaskMod:
    """Packed sequences: query i attends key j only within its own document
    (``document_ids[i] == document_ids[j]``), causally by default. document_ids: (L,) or (B, L)
    integers (negative ids mark padding, which attends and is attended by nothing)."""
    table = _captured(_per_example("document_ids", document_ids, "int"), -1)

    def mod(b, h, q_idx, kv_idx):
        q_doc = _take(table, b, q_idx, "document_ids")
        same = (q_doc == _take(table, b, kv_idx, "document_ids")) & (q_doc >= 0)
        return same & (kv_idx <= q_idx) if causal else same

    return _named(mod, f"document_mod(causal={causal})", document_ids.shape[-1])


def dilated_window_mod(window: int, dilation: int, *, causal: bool = False) -> MaskMod:
    """Dilated sliding window (Longformer): keys at distances that are multiples of ``dilation``,
    up to ``window // 2`` steps on each side (only the past if ``causal``)."""
    radius = _non_negative("window", window) // 2
    if isinstance(dilation, bool) or not isinstance(dilation, int) or dilation < 1:
        raise ValueError(f"dilation must be a positive int, got {dilation!r}")

    def mod(b, h, q_idx, kv_idx):
        distance = q_idx - kv_idx
        allowed = (distance % dilation == 0) & (distance.abs() <= radius * dilation)
        return allowed & (distance >= 0) if causal else allowed

    return _named(mod, f"dilated_window_mod(window={window}, dilation={dilation}, causal={causal})")


def sinks_window_mod(sinks: int, window: int, *, offset: int = 0) -> MaskMod:
    """StreamingLLM (Xiao et al. 2023): causal, each query attends the first ``sinks`` keys and
    the ``window`` most recent ones: ``j < sinks or i + offset - window < j``, with ``j <= i + offset``."""
    sinks = _non_negative("sinks", sinks)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int, got {window!r}")

    def mod(b, h, q_idx, kv_idx):
        aligned = q_idx + offset
        return (kv_idx <= aligned) & ((kv_idx < sinks) | (kv_idx > aligned - window))

    return _named(mod, f"sinks_window_mod(sinks={sinks}, window={window})")


def _positions(mods) -> int | None:
    known = [m.positions for m in mods if getattr(m, "positions", None) is not None]
    return min(known) if known else None


def _combine_mods(mods, name: str, op) -> MaskMod:
    """One mask_mod that combines ``mods`` with ``op`` (logical and / or), pair by pair."""

    def mod(b, h, q_idx, kv_idx):
        out = mods[0](b, h, q_idx, kv_idx)
        for m in mods[1:]:
            out = op(out, m(b, h, q_idx, kv_idx))
        return out

    return _named(mod, f"{name}(" + ", ".join(getattr(m, "__name__", "mask_mod") for m in mods) + ")", _positions(mods))


and_mods = alias(and_masks, "and_mods")  # deprecated: and_masks takes mask_mods (FlexAttention's name)
or_mods = alias(or_masks, "or_mods")  # deprecated: or_masks takes mask_mods


def _longformer_first(L: int, S: int | None = None, *, window: int = 512, num_global: int = 16) -> MaskMod:
    flags = torch.zeros(L, dtype=torch.bool)
    flags[:num_global] = True
    return longformer_mod(window, flags)


PATTERNS = {
    "causal": lambda L, S=None, **kw: causal_mod(**kw),
    "window": lambda L, S=None, *, window=512: window_mod(window),
    "longformer": _longformer_first,
    "bigbird": lambda L, S=None, **kw: bigbird_mod(L, S, **kw),
    "prefix-lm": lambda L, S=None, *, prefix=None: prefix_lm_mod(L // 4 if prefix is None else prefix),
    "documents": lambda L, S=None, *, documents=8: document_mod(torch.arange(L) * documents // max(1, L)),
    "dilated": lambda L, S=None, *, window=512, dilation=2: dilated_window_mod(window, dilation),
    "sinks": lambda L, S=None, *, sinks=4, window=512: sinks_window_mod(sinks, window),
}
"""Named patterns with benchmark defaults, ``name -> factory(L, S=None, **options) -> mask_mod``:
Longformer puts its globals at the first ``num_global`` tokens; documents splits the sequence
into ``documents`` equal packed documents; prefix-LM takes a quarter of L as prefix."""
