"""The plain call: no mask, bias, window, score_mod, sinks, dropout, weights or lse. :func:`attnkit.attention`
hands it to SDPA as it is, without a :class:`~.backends.common.Problem` or routing (what ``auto`` would choose
anyway); the NaN rule, where it is on, is :func:`attnkit.attention`'s (:mod:`.nan`).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from .backends import sdpa
from .checks import Dims, check_qkv, readable_query
from .mask_mods import ALIGNMENTS
from .tracing import is_compiling

__all__ = ["one_head_shape", "plain", "plain_causal"]


def one_head_shape(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, causal_align) -> Tensor | None:
    """SDPA's output, as it returns it, of a plain uncompiled CPU call whose q
    (B, H, L, E), k and v (B, H, S, E) share their batch, heads and head dim: self-attention's commonest call and a
    decoding step's. None for any other call, and where the causal alignment needs a mask. The caller settled that
    nothing else was asked (no mask, bias, window, scale, score_mod, sinks, dropout, weights or lse). A comparison
    of k's shape with v's and three of q's sizes stand for :func:`.checks.check_qkv`'s, and SDPA checks the dtypes
    and devices itself; where it refuses them, ``check_qkv`` names the argument. Not while compiling or exporting,
    where shapes may be symbols and a comparison a guard. The caller settled that the NaN rule is off."""
    try:
        kshape = k.shape
        if not q.is_cpu or is_compiling() or kshape != v.shape:  # (compiling first: sizes may be symbols)
            return None
        B, H, L, E = q.shape
        Bk, Hk, S, Ek = kshape
    except (AttributeError, TypeError, ValueError, RuntimeError):  # not tensors, not of rank 4, nested: named below
        return None
    if B != Bk or H != Hk or E != Ek or not (B and H and L and S and E):
        return None
    if causal_align != "top-left":  # (the commonest alignment, and a decoding step's, decided inline)
        causal = False if L == 1 and causal_align == "bottom-right" else plain_causal(is_causal, causal_align, L, S)
        if causal is None:  # a mask is needed, or the alignment is wrong (named by the checked path)
            return None
        is_causal = causal
    if not q.is_contiguous():  # (an ordinary call pays one flag read; an overlapping query is copied)
        q = readable_query(q)
    try:
        if is_causal:  # (a keyword costs SDPA's argument parser a quarter of a microsecond: only where needed)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v)
    except (RuntimeError, TypeError, NotImplementedError):
        check_qkv(q, k, v)  # a dtype or a device attnkit refuses: named (SDPA's own message otherwise)
        raise


def plain(q: Tensor, k: Tensor, v: Tensor, dims: Dims, scale: float | None, causal: bool) -> Tensor:
    """SDPA's output for a plain call (the NaN rule, where it is on, is the caller's: :mod:`.nan`). The commonest call (as
    many key as query heads, values as wide as the queries, SDPA's own scale) goes to SDPA here, without
    :func:`.backends.sdpa.plain`'s questions."""
    if dims.H == dims.Hkv and dims.Ev >= dims.E and scale is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True) if causal else F.scaled_dot_product_attention(q, k, v)
    return sdpa.plain(q, k, v, scale, causal, dims.H != dims.Hkv)


def plain_causal(is_causal: bool, causal_align, L: int, S: int) -> bool | None:
    """The ``is_causal`` SDPA takes for a plain call, or None where the alignment needs a mask: top-left
    as given; bottom-right is top-left when L = S, and no mask at all for a single query (a decoding
    step sees every key)."""
    if not is_causal or causal_align == "top-left":
        return is_causal if causal_align in ALIGNMENTS else None  # (a bad alignment: named below)
    if causal_align == "bottom-right" and (L == S or L == 1):
        return L == S
    return None
