"""Sparse patterns as ``mask_mod(b, h, q_idx, kv_idx) -> bool`` functions (FlexAttention's
semantics; True = may attend), each evaluated on broadcast index tiles (see
:mod:`attnkit.functional.block_mask`): b (B, 1, 1, 1), h (1, H, 1, 1), q_idx (1, 1, bq, 1), kv_idx
(1, 1, 1, bk). :func:`window_mod` (two-sided, encoders), :func:`longformer_mod`,
:func:`bigbird_mod`, :func:`prefix_lm_mod`, :func:`document_mod` (packed sequences),
:func:`dilated_window_mod`, :func:`sinks_window_mod` (StreamingLLM), and the named ones in
:data:`PATTERNS`. Combine them with :func:`attnkit.masks.and_masks` / ``or_masks``. Every name
here is also in :mod:`attnkit.functional.masks` and :mod:`attnkit.masks`."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from .._deprecated import UNSET, renamed
from .block_mask import MaskMod, length_bucket
from .checks import check_int

__all__ = ["ALIGNMENTS", "causal_offset", "causal_mod", "padding_mod", "real_tokens_mod", "window_mod",
           "longformer_mod", "bigbird_mod", "prefix_lm_mod", "document_mod", "dilated_window_mod", "sinks_window_mod",
           "PATTERNS", "pattern_options"]

ALIGNMENTS = ("top-left", "bottom-right")
"""Causal alignment when L != S: top-left (query i sees keys j <= i, PyTorch's ``is_causal``) or
bottom-right (j <= i + S - L: the last query sees the last key, for decoding with a cache)."""


def causal_offset(L: int, S: int, causal_align: str) -> int:
    """Key index that query 0 is aligned with: 0 for top-left, S - L for bottom-right."""
    if causal_align not in ALIGNMENTS:
        raise ValueError(f"causal_align must be one of {ALIGNMENTS}, got {causal_align!r}")
    return S - L if causal_align == "bottom-right" else 0


def _aligned_offset(where: str, L: int | None, S: int | None, causal_align: str, offset) -> int:
    """The offset of a causal mask_mod from ``causal_align`` (bottom-right needs L and S), or from the
    deprecated integer ``offset``."""
    if offset is not UNSET:
        renamed(where, "offset", "causal_align", offset, UNSET, None)  # warns
        if causal_align != "top-left" or L is not None or S is not None:
            raise TypeError(f"{where}: pass causal_align= (with L and S) only; offset= is its deprecated old form")
        return int(offset)
    if causal_align == "bottom-right" and (L is None or S is None):
        raise ValueError(f"{where}: causal_align='bottom-right' needs L and S (the key index query 0 sees is S - L)")
    return 0 if L is None or S is None else causal_offset(check_int("L", L, 0), check_int("S", S, 0), causal_align)


def _named(function: MaskMod, name: str, positions: int | None = None) -> MaskMod:
    """Name a mask_mod; ``positions``: the length of the tables it reads (``mod.positions``), beyond
    which :func:`block_mask` refuses it rather than read the tables' padding."""
    function.__name__ = function.__qualname__ = name
    function.positions = positions  # type: ignore[attr-defined]  # read by block_mask()
    return function


def _non_negative(name: str, value) -> int:
    return check_int(name, value, 0)


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


def causal_mod(L: int | None = None, S: int | None = None, *, causal_align: str = "top-left", offset=UNSET) -> MaskMod:
    """Causal: query i attends keys j <= i (top-left) or j <= i + S - L (``causal_align="bottom-right"``,
    which needs L and S). ``offset`` is the deprecated integer form; so is one positional int alone,
    ``causal_mod(S - L)`` (the old signature), which is read as that offset."""
    if L is not None and S is None and offset is UNSET:
        L, offset = None, L  # causal_mod(offset): the only one-int call there was
    shift = _aligned_offset("causal_mod", L, S, causal_align, offset)
    return _named(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx + shift, f"causal_mod(offset={shift})")


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


def window_mod(width=UNSET, *, window=UNSET) -> MaskMod:
    """Two-sided sliding window for encoders: |i - j| <= width // 2 (``width`` is the whole band, as
    Longformer's ``attention_window``; ``window`` is its deprecated old name, now kept for the causal
    look-back of :func:`attnkit.attention`)."""
    width = renamed("window_mod", "window", "width", window, width, UNSET)
    radius = _non_negative("width", width) // 2
    return _named(lambda b, h, q_idx, kv_idx: (q_idx - kv_idx).abs() <= radius, f"window_mod({width})")


def longformer_mod(width=UNSET, global_tokens: Tensor | None = None, *, window=UNSET) -> MaskMod:
    """Longformer (Beltagy et al. 2020): a two-sided band of ``width`` (|i - j| <= width // 2) plus
    global tokens, which attend every key and which every query attends (``window`` is the
    deprecated old name of ``width``).

    Args:
        global_tokens: (L,) or (B, L) boolean, True at global positions (e.g. [CLS], the question).
    """
    width = renamed("longformer_mod", "window", "width", window, width, UNSET)
    if global_tokens is None:
        raise TypeError("longformer_mod needs global_tokens, (L,) or (B, L) boolean")
    local = window_mod(width)
    table = _captured(_per_example("global_tokens", global_tokens, "bool"), False)

    def mod(b, h, q_idx, kv_idx):
        return (local(b, h, q_idx, kv_idx) | _take(table, b, q_idx, "global_tokens")
                | _take(table, b, kv_idx, "global_tokens"))

    return _named(mod, f"longformer_mod(width={width})", global_tokens.shape[-1])


def bigbird_mod(
    L: int, S: int | None = None, *, window_blocks=UNSET, num_global: int = 1, random_blocks: int = 3,
    block: int = 64, seed: int = 0, window=UNSET,
) -> MaskMod:
    """BigBird (Zaheer et al. 2020), in blocks of ``block`` tokens: ``num_global`` global blocks at
    the start (attend and attended by all), a band of ``window_blocks`` blocks centred on the query's
    block (default 3; ``window`` is its deprecated old name), and ``random_blocks`` key blocks per
    query block drawn with ``seed`` (the same for every example and head, reproducible)."""
    window = renamed("bigbird_mod", "window", "window_blocks", window, window_blocks, 3)
    S = L if S is None else S
    for name, value in (("L", L), ("S", S), ("window_blocks", window), ("num_global", num_global),
                        ("random_blocks", random_blocks)):
        _non_negative(name, value)
    check_int("block", block, 1)
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

    mod.random_table = chosen  # type: ignore[attr-defined]  # (query blocks, key blocks) True where a random block was drawn
    return _named(mod, f"bigbird_mod(window_blocks={window}, num_global={num_global}, random_blocks={random_blocks}, block={block}, seed={seed})")


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


def dilated_window_mod(width=UNSET, dilation: int | None = None, *, causal: bool = False, window=UNSET) -> MaskMod:
    """Dilated sliding window (Longformer): keys at distances that are multiples of ``dilation``,
    up to ``width // 2`` steps on each side (only the past if ``causal``; ``window`` is the
    deprecated old name of ``width``)."""
    width = renamed("dilated_window_mod", "window", "width", window, width, UNSET)
    radius = _non_negative("width", width) // 2
    check_int("dilation", dilation, 1)

    def mod(b, h, q_idx, kv_idx):
        distance = q_idx - kv_idx
        allowed = (distance % dilation == 0) & (distance.abs() <= radius * dilation)
        return allowed & (distance >= 0) if causal else allowed

    return _named(mod, f"dilated_window_mod(width={width}, dilation={dilation}, causal={causal})")


def sinks_window_mod(sinks: int, window: int, L: int | None = None, S: int | None = None, *,
                     causal_align: str = "top-left", offset=UNSET) -> MaskMod:
    """StreamingLLM (Xiao et al. 2023): causal, each query attends the first ``sinks`` keys and the
    ``window`` most recent ones up to its aligned position a: ``j < sinks or a - window < j``, with
    ``j <= a``; a = i (top-left) or i + S - L (``causal_align="bottom-right"``, which needs L and S).
    ``offset`` is the deprecated integer form of the alignment."""
    sinks = _non_negative("sinks", sinks)
    check_int("window", window, 1)
    shift = _aligned_offset("sinks_window_mod", L, S, causal_align, offset)

    def mod(b, h, q_idx, kv_idx):
        aligned = q_idx + shift
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


def _longformer_first(L: int, S: int | None = None, *, width: int = 512, num_global: int = 16) -> MaskMod:
    flags = torch.zeros(L, dtype=torch.bool)
    flags[:num_global] = True
    return longformer_mod(width, flags)


PATTERNS: dict[str, Callable[..., MaskMod]] = {
    "causal": lambda L, S=None, **kw: causal_mod(L, S, **kw),
    "window": lambda L, S=None, *, width=512: window_mod(width),
    "longformer": _longformer_first,
    "bigbird": lambda L, S=None, **kw: bigbird_mod(L, S, **kw),
    "prefix-lm": lambda L, S=None, *, prefix=None: prefix_lm_mod(L // 4 if prefix is None else prefix),
    "documents": lambda L, S=None, *, documents=8: document_mod(torch.arange(L) * documents // max(1, L)),
    "dilated": lambda L, S=None, *, width=512, dilation=2: dilated_window_mod(width, dilation),
    "sinks": lambda L, S=None, *, sinks=4, window=512: sinks_window_mod(sinks, window),
}
"""Named patterns with benchmark defaults, ``name -> factory(L, S=None, **options) -> mask_mod``:
the two-sided bands take ``width``, the causal look-back of sinks ``window``; Longformer puts its
globals at the first ``num_global`` tokens; documents splits the sequence into ``documents`` equal
packed documents; prefix-LM takes a quarter of L as prefix."""

_RENAMED_OPTIONS = {("window", "window"): "width", ("longformer", "window"): "width", ("dilated", "window"): "width",
                    ("bigbird", "window"): "window_blocks"}
"""(pattern, old option) -> today's name: a two-sided band is ``width``; ``window`` is the causal look-back."""


def pattern_options(pattern: str, options: dict) -> dict:
    """``options`` of the named pattern under today's names: an old name (``window`` of a two-sided
    band) warns with a FutureWarning naming the new one and is honoured for one release."""
    current = {}
    for name, value in options.items():
        new = _RENAMED_OPTIONS.get((pattern, name))
        if new is None:
            current[name] = value
            continue
        if new in options:
            raise TypeError(f"pattern {pattern!r}: pass {new}= only ({name}= is its deprecated old name)")
        warnings.warn(f"pattern {pattern!r}: option {name}= is deprecated, use {new}= (same meaning); the old name "
                      "goes in the next release", FutureWarning, stacklevel=3)
        current[new] = value
    return current
