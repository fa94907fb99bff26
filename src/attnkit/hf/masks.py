"""The mask transformers asks attnkit for: structure plus padding where it is provably that.

transformers calls a registered mask function (its ``AttentionMaskInterface``) once per forward and
passes the result to every attention call. :func:`attnkit_mask` recognises transformers' own causal,
causal sliding-window and bidirectional mask functions with top-left or bottom-right offsets and
returns a :class:`StructuredMask`, the (B|1, 1, 1, S) padding alone with the structure attached;
anything else gets transformers' own SDPA mask, fully built.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..functional.tracing import traced
from .families import model_type
from .rows import EmptyRows, structured_empty_rows

__all__ = ["StructuredMask", "attnkit_mask", "MASK_READING_FAMILIES", "ADDITIVE_MASK_FAMILIES"]

MASK_READING_FAMILIES = frozenset({
    # DeepSeek sparse attention's indexer scores every key against attention_mask[:, 0] before attention
    # sees the mask: it needs the whole (B, 1, L, S) mask, causality included, as eager's indexer gets it.
    "deepseek_v32", "hy_v4", "hy_v4_vl", "glm_moe_dsa", "mistral_large4", "dots3_note", "axk2",
})
"""Families whose modules read the attention mask themselves, not only hand it to attention: they get
transformers' own mask, fully built (a structured mask holds the padding alone)."""
ADDITIVE_MASK_FAMILIES = frozenset({
    # DeepSeek-V4 concatenates an additive bias (0 / -inf) of its compressed blocks to the mask, cast to the
    # mask's dtype: to a boolean mask that cast turns -inf into True (allowed). It gets eager's additive mask.
    "deepseek_v4",
})
"""Families whose modules extend the mask with additive values: they get transformers' eager (additive)
mask, fully built, which attnkit reads as a bias whose finfo.min keys are masked."""


@dataclass(frozen=True)
class _Structure:
    """What :func:`attnkit_mask` proved a mask to be: causal or not, a causal window, the causal
    alignment, and whether the tensor's values are a padding mask (else all True, ignored)."""

    is_causal: bool
    window: int | None
    causal_align: str
    padded: bool


class StructuredMask(Tensor):
    """The (B|1, 1, 1, S) boolean padding mask attnkit's mask function returns where it has proved
    the whole mask is structure (causal, a causal window, or bidirectional) plus padding; the
    structure rides along as ``structure``. Any operation on it yields a StructuredMask without a
    structure, which the attention function refuses instead of guessing.

    A mask with a structure keeps beside it what every layer reads: ``padding``, the same tensor as a plain
    ``Tensor`` (the same memory), and ``keys``, its S. Read through the subclass, ``mask.shape`` goes through
    ``__torch_function__`` (4.9 us a read, once per layer call) and ``as_subclass(Tensor)`` costs 1.3 us
    (benchmarks/overhead.py)."""

    structure: _Structure | None = None
    padding: Tensor | None = None  # (set with the structure: an operation's result has neither)
    keys: int | None = None

    def empty_rows(self, L: int, S: int) -> EmptyRows | None:
        """The rows with no allowed key for L queries and S keys (:mod:`attnkit.hf.rows`): counted once
        per mask and shape, for every layer that receives this mask."""
        assert self.structure is not None  # the attention function refuses a mask without one first
        cache = self.__dict__.setdefault("_empty_rows", {})
        if (L, S) not in cache:
            structure = self.structure
            offset = 0 if structure.causal_align == "top-left" else S - L
            padding = self.padding if structure.padded else None
            cache[(L, S)] = structured_empty_rows(padding, L, S, causal=structure.is_causal, window=structure.window,
                                                  offset=offset)
        return cache[(L, S)]


def _structured(padding: Tensor, structure: _Structure) -> Tensor:
    mask = padding.as_subclass(StructuredMask)
    mask.structure, mask.padding, mask.keys = structure, padding, padding.shape[-1]
    return mask


_kept_masking_utils = None


def _masking_utils():
    """transformers' ``masking_utils``, imported on first use (attnkit imports without transformers; ``register()``
    makes that use) and then kept in a module global: an import statement in a function is a lookup through the
    import machinery on every call, and torch 2.11's TorchDynamo cannot trace transformers' lazy import (nor a
    ``functools.cache`` around it) inside a compiled model, where a global it reads as it is."""
    global _kept_masking_utils
    if _kept_masking_utils is None:
        from transformers import masking_utils

        _kept_masking_utils = masking_utils
    return _kept_masking_utils


def _int_offset(value) -> int | None:
    if isinstance(value, Tensor):  # a static cache's offset: read it only where that costs no sync
        return int(value) if value.is_cpu and value.numel() == 1 else None
    return int(value)


def _sliding_window_of(mask_function) -> int | None:
    """w if ``mask_function`` is transformers' ``sliding_window_causal_mask_function(w)`` (an
    ``and_masks`` of the window overlay and the causal function), else None."""
    mu = _masking_utils()

    if getattr(mask_function, "__qualname__", "") != "and_masks.<locals>.and_mask" or not mask_function.__closure__:
        return None
    parts = mask_function.__closure__[0].cell_contents
    if not isinstance(parts, tuple) or len(parts) != 2 or parts[1] is not mu.causal_mask_function:
        return None
    overlay = parts[0]
    if getattr(overlay, "__qualname__", "") != "sliding_window_overlay.<locals>.inner_mask" or not overlay.__closure__:
        return None
    window = overlay.__closure__[0].cell_contents
    return window if isinstance(window, int) and not isinstance(window, bool) and window >= 1 else None


def _recognise(mask_function, local_size, allow_causal: bool, allow_bidirectional: bool, q_length: int,
               kv_length: int, q_offset, kv_offset) -> _Structure | None:
    """The structure of the mask transformers asks for, where it is provably one attnkit applies
    itself; None where it must be built (packed sequences, or/and overlays, chunks, odd offsets)."""
    mu = _masking_utils()

    q0, k0 = _int_offset(q_offset), _int_offset(kv_offset)
    if q0 is None or k0 is None:
        return None
    if mask_function is mu.bidirectional_mask_function and local_size is None and allow_bidirectional:
        return _Structure(is_causal=False, window=None, causal_align="top-left", padded=False)
    if not allow_causal:
        return None
    if mask_function is mu.causal_mask_function and local_size is None:
        window = None
    else:
        window = _sliding_window_of(mask_function)
        if window is None or window != local_size:
            return None
    offset = q0 - k0  # key j is allowed for query i iff j <= i + offset (and > i + offset - window)
    if offset == 0:
        align = "top-left"
    elif offset == kv_length - q_length:
        align = "bottom-right"
    else:
        return None
    return _Structure(is_causal=True, window=window, causal_align=align, padded=False)


def attnkit_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                 mask_function=None, attention_mask: Tensor | None = None, local_size: int | None = None,
                 allow_is_causal_skip: bool = True, allow_is_bidirectional_skip: bool = False, **kwargs) -> Tensor | None:
    """The mask transformers asks for (its mask interface's signature).

    Where the whole mask is provably structure plus padding (transformers' plain causal, causal
    sliding-window or bidirectional mask function, offsets that are top-left or bottom-right, the
    caller allowing a skipped mask), a :class:`StructuredMask` of the padding alone, (B, 1, 1, S),
    carries that structure to :func:`attnkit_attention_forward`: no (L, S) tensor is built.
    Anything else gets transformers' own SDPA mask, fully built, and is used unchanged; so does every
    mask of a family in :data:`MASK_READING_FAMILIES`."""
    mu = _masking_utils()

    mask_function = mu.causal_mask_function if mask_function is None else mask_function
    family = model_type(kwargs.get("config"))
    if family in ADDITIVE_MASK_FAMILIES:
        return mu.eager_mask(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function=mask_function,
                             attention_mask=attention_mask, local_size=local_size, **kwargs)
    if family in MASK_READING_FAMILIES:
        return mu.sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function=mask_function,
                            attention_mask=attention_mask, local_size=local_size, allow_is_causal_skip=False,
                            allow_is_bidirectional_skip=False, **kwargs)
    structure = None if traced() else _recognise(mask_function, local_size, allow_is_causal_skip,
                                                 allow_is_bidirectional_skip, q_length, kv_length, q_offset, kv_offset)
    # (compiled, exported or under a transform: transformers' own mask, as its sdpa gets it. A StructuredMask is a
    # tensor subclass, which TorchDynamo breaks its graph on and a fake tensor cannot become.)
    padding = None
    if structure is not None and attention_mask is not None:
        if attention_mask.dim() == 2:
            start = _int_offset(kv_offset)  # an int: _recognise has read it
            prepared = mu.prepare_padding_mask(attention_mask, kv_length, kv_offset)
            if start is not None and prepared is not None:
                padding = prepared[:, start:start + kv_length]
        if padding is None or tuple(padding.shape) != (batch_size, kv_length):
            structure = None  # not a plain (B, S) padding mask: transformers builds the whole mask
    if structure is None:
        return mu.sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function=mask_function,
                            attention_mask=attention_mask, local_size=local_size, allow_is_causal_skip=False,
                            allow_is_bidirectional_skip=False, **kwargs)
    if padding is None or bool(padding.all()):
        return _structured(torch.ones(1, 1, 1, kv_length, dtype=torch.bool, device=kwargs.get("device", "cpu")),
                           structure)
    return _structured(padding.bool()[:, None, None, :],
                       _Structure(structure.is_causal, structure.window, structure.causal_align, padded=True))
