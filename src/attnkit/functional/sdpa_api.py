"""PyTorch's SDPA vocabulary in attnkit: its keyword names in :func:`attnkit.attention`, and a drop-in
:func:`scaled_dot_product_attention` with ``torch.nn.functional.scaled_dot_product_attention``'s exact
signature and return type, running attnkit's backends.

Where a name is shared, torch's meaning holds: ``attn_mask`` boolean is True where a query may attend
(as attnkit's ``mask``), a float one is added to the scaled scores (attnkit's ``bias``); ``is_causal``
is top-left aligned; ``enable_gqa=False`` refuses a call with fewer key than query heads. Where attnkit
deliberately differs (docs/api.md):

- a query row with no key it may attend gets a zero output, where torch's SDPA gives NaN (its math
  kernel) or zeros (its fused ones): attnkit's zeros on every backend;
- a float ``attn_mask`` entry of -inf or at most finfo.min / 2 is a masked key (torch adds it:
  finfo.min rows then average their keys), as every attnkit backend reads additive masks;
- a NaN in a query, key or value makes only the rows it reaches NaN (:mod:`attnkit.functional.nan`).

A wrong keyword is named with the right one (:func:`unexpected_keywords`). The vocabulary itself lives below
attention() in :mod:`.sdpa_names` (re-exported here); this module, the drop-in, stands on attention().
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .nested import any_nested
from .sdpa_names import (
    SYNONYMS,
    causal_bias_alignment,
    check_enable_gqa,
    is_causal_bias,
    sdpa_mask,
    unexpected_keywords,
)

__all__ = ["scaled_dot_product_attention", "sdpa_mask", "check_enable_gqa", "unexpected_keywords", "SYNONYMS"]

def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, *, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` with attnkit's backends (``auto``):
    the same signature, shapes and return (a tensor), drop-in.

    query (..., Hq, L, E), key (..., H, S, E), value (..., H, S, Ev): any number of batch dims, broadcast
    against each other as torch broadcasts them (a 3-D query against 4-D keys shares the query across the
    batch); with ``enable_gqa=True`` the heads dim -3 may differ (Hq a multiple of H) and the dims before
    it broadcast. ``attn_mask`` broadcastable to (..., Hq, L, S), boolean (True = takes part in attention)
    or float (added, in the query's dtype as torch adds it). ``scale``: any finite number (0 and negative
    ones too). ``is_causal``: top-left causal, not with an attn_mask (torch refuses both). ``dropout_p``
    applies whenever given, as torch's functional call does. Differences from torch (module docstring):
    zeros for a row with no allowed key, additive masks of finfo.min read as masked keys, attnkit's NaN rule where it is on.
    """
    from .attention import attention

    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, Tensor) or x.dim() < 2:
            got = f"shape {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"{name} must be a tensor of at least 2 dims (..., L, E), got {got}")
    if is_causal and attn_mask is not None:
        raise ValueError("attn_mask and is_causal=True: pass one (torch's SDPA refuses both as well)")
    align = "top-left"
    if is_causal_bias(attn_mask):  # torch's causal_upper_left / causal_lower_right: a causal call
        align, is_causal, attn_mask = causal_bias_alignment(attn_mask, False, align, query, key), True, None
    if any_nested(query, key, value):  # jagged sequences, as torch's SDPA takes them (:mod:`.nested`)
        return attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                         causal_align=align, scale=scale, enable_gqa=bool(enable_gqa)).output
    query, key, value = _broadcast_batch(query, key, value, bool(enable_gqa))
    lead = tuple(query.shape[:-2])
    Hq = lead[-1] if lead else 1
    H = key.shape[-3] if key.dim() >= 3 else 1
    check_enable_gqa(bool(enable_gqa), query, key)
    if H == 0:  # no heads (a 3-D call of batch 0 among them): nothing to attend, torch's empty result, its gradients
        # flowing back as zeros: two products of empty tensors (torch 2.11's CPU SDPA dies of a floating-point
        # exception on such a call, which attnkit used to hand it)
        return (query @ key.transpose(-2, -1)) @ value
    batch = math.prod(lead[:-1])
    L, S = query.shape[-2], key.shape[-2]
    q = query.reshape(batch, Hq, L, query.shape[-1])
    k = key.reshape(batch, H, S, key.shape[-1])
    v = value.reshape(batch, H, S, value.shape[-1])
    mask = bias = None
    if attn_mask is not None:
        if attn_mask.is_floating_point() and attn_mask.dtype != query.dtype:  # torch adds it in the query's dtype
            attn_mask = attn_mask.to(query.dtype)
        mask, bias = sdpa_mask(_broadcast_mask(attn_mask, lead, L, S, batch), None, None)
    out = attention(q, k, v, mask=mask, bias=bias, is_causal=is_causal, causal_align=align, scale=scale,
                    dropout_p=dropout_p).output
    return out.reshape(*lead, L, value.shape[-1])


def _broadcast_batch(query: Tensor, key: Tensor, value: Tensor, grouped: bool) -> tuple[Tensor, Tensor, Tensor]:
    """query, key and value with their batch dims broadcast as torch's SDPA broadcasts them: every dim before
    (L, E), or, for a grouped call whose heads differ (``enable_gqa``), every dim before the heads."""
    heads_differ = query.dim() >= 3 and key.dim() >= 3 and query.shape[-3] != key.shape[-3]
    kept = 3 if grouped and heads_differ else 2
    try:
        batch = torch.broadcast_shapes(*(x.shape[:-kept] for x in (query, key, value)))
    except RuntimeError as error:
        if heads_differ and not grouped:
            check_enable_gqa(False, query, key)  # the likelier mistake: grouped heads without enable_gqa=True
        raise ValueError(f"the batch dims of query {tuple(query.shape)}, key {tuple(key.shape)} and value "
                         f"{tuple(value.shape)} do not broadcast (torch's rule; (..., H, L|S, E))") from error
    return tuple(x if tuple(x.shape[:-kept]) == tuple(batch) else x.expand(*batch, *x.shape[-kept:])
                 for x in (query, key, value))  # type: ignore[return-value]


def _broadcast_mask(attn_mask: Tensor, lead: tuple, L: int, S: int, batch: int) -> Tensor:
    """torch's broadcasting of ``attn_mask`` to (..., Hq, L, S), as attnkit's (L|1, S) or
    (B|1, Hq|1, L|1, S): a mask shared by the batch stays one view; a per-example one is broadcast
    to the batch dims and flattened."""
    target = (*lead, L, S)
    try:
        full = torch.broadcast_shapes(tuple(attn_mask.shape), target)
    except RuntimeError as error:
        raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to (..., Hq, L, S) = "
                         f"{target}") from error
    if full != target:
        raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} broadcasts beyond the attention's "
                         f"{target} to {full}")
    if attn_mask.dim() < 2:
        attn_mask = attn_mask.reshape(1, -1)
    if attn_mask.shape[-1] != S:  # attnkit takes every key's entry
        attn_mask = attn_mask.expand(*attn_mask.shape[:-1], S)
    if all(n == 1 for n in attn_mask.shape[:-2]):
        return attn_mask.reshape(attn_mask.shape[-2], S)
    shaped = attn_mask.reshape((1,) * (len(target) - attn_mask.dim()) + tuple(attn_mask.shape))
    if all(n == 1 for n in shaped.shape[:-3]):  # one mask per head: (1, Hq, L|1, S)
        return shaped.reshape(1, shaped.shape[-3], shaped.shape[-2], S)
    return shaped.expand(target).reshape(batch, lead[-1], L, S)
