"""PyTorch's SDPA vocabulary and its neighbours' as :func:`attnkit.attention` reads them: the names attention()
shares with ``torch.nn.functional.scaled_dot_product_attention`` (``attn_mask``, ``enable_gqa``) with torch's
meaning, and the keywords of other libraries named with attnkit's own when given by mistake. Below both
attention() and the drop-in :func:`attnkit.functional.sdpa_api.scaled_dot_product_attention`, which read it."""

from __future__ import annotations

import difflib
import sys
from typing import Any

import torch
from torch import Tensor

__all__ = ["SYNONYMS", "unexpected_keywords", "check_enable_gqa", "sdpa_mask", "is_causal_bias", "causal_bias_alignment"]

_BIAS_MODULE = "torch.nn.attention.bias"


def is_causal_bias(attn_mask: Any) -> bool:
    """Whether ``attn_mask`` is torch's ``CausalBias``. Asked of ``torch.nn.attention.bias`` only where it has been
    imported (a CausalBias comes from it): importing it imports TorchDynamo, a second and more of attnkit's import."""
    module = sys.modules.get(_BIAS_MODULE)
    return module is not None and isinstance(attn_mask, module.CausalBias)

SYNONYMS = {
    # other libraries' names -> what attnkit.attention takes instead
    "key_padding_mask": "mask=attnkit.masks.from_key_padding_mask(key_padding_mask) (torch's True = ignore "
                        "becomes attnkit's True = may attend)",
    "attention_mask": "mask= (boolean, True = may attend) or bias= (additive float)",
    "block_mask": "mask= (torch's or attnkit's BlockMask)",
    "causal": "is_causal=",
    "softmax_scale": "scale=",
    "sm_scale": "scale=",
    "dropout": "dropout_p=",
    "attn_dropout": "dropout_p=",
    "window_size": "window= (a causal sliding window of that many keys)",
    "sliding_window": "window= (a causal sliding window of that many keys)",
    "return_attn_probs": "need_weights=",
    "output_attentions": "need_weights=",
    "return_weights": "need_weights=",
    "attn_bias": "bias=",
    "position_bias": "bias=",
    "s_aux": "sinks=",
    "return_aux": "return_lse=True",
}


def unexpected_keywords(function: str, unknown: dict, accepted) -> TypeError:
    """The error for keywords ``function`` does not take, each with the name it most likely meant:
    a known synonym from another library (:data:`SYNONYMS`), else the closest accepted name."""
    parts = []
    for name in unknown:
        hint = SYNONYMS.get(name)
        if hint is None:
            close = difflib.get_close_matches(name, list(accepted), n=1, cutoff=0.6)
            hint = f"{close[0]}=" if close else None
        parts.append(f"{name!r}" + (f" (did you mean {hint}?)" if hint else ""))
    return TypeError(f"{function}() got unexpected keyword argument{'s' if len(parts) > 1 else ''} "
                     f"{', '.join(parts)}; it takes {', '.join(accepted)}")


def check_enable_gqa(enable_gqa: bool | None, q: Tensor, k: Tensor) -> None:
    """SDPA's ``enable_gqa``: None (attnkit's default) and True take fewer key than query heads;
    False refuses them, as torch does."""
    if enable_gqa is None or enable_gqa is True:
        return
    if enable_gqa is not False:
        raise TypeError(f"enable_gqa must be True, False or None, got {enable_gqa!r}")
    Hq = q.shape[-3] if isinstance(q, Tensor) and q.dim() >= 3 else 1
    H = k.shape[-3] if isinstance(k, Tensor) and k.dim() >= 3 else 1
    if Hq != H:
        raise ValueError(f"enable_gqa=False, but q has {Hq} heads and k {H}: pass enable_gqa=True (or leave it out) "
                         "for grouped-query attention")


def sdpa_mask(attn_mask: Tensor, mask, bias) -> tuple[Tensor | None, Tensor | None]:
    """SDPA's ``attn_mask`` as attnkit's ``(mask, bias)``: boolean -> mask (True = may attend, the
    same convention), float -> bias (added to the scaled scores). Given beside the attnkit argument
    of the same meaning, refused by name."""
    if not isinstance(attn_mask, Tensor):
        raise TypeError(f"attn_mask must be a boolean or float tensor (SDPA's meaning), got {type(attn_mask).__name__}")
    if attn_mask.dtype == torch.bool:
        if mask is not None:
            raise ValueError("attn_mask (boolean) and mask are the same argument: pass one (and them combined with "
                             "attnkit.masks.and_masks where you need both)")
        return attn_mask, bias
    if not attn_mask.is_floating_point():
        raise TypeError(f"attn_mask must be boolean (True = may attend) or float (added to the scores), "
                        f"got dtype {attn_mask.dtype}")
    if bias is not None:
        raise ValueError("attn_mask (float) and bias are the same argument: pass one (their sum where you need both)")
    return mask, attn_mask


def causal_bias_alignment(attn_mask: Any, is_causal, causal_align: str, q, k) -> str:
    """torch's ``CausalBias`` as SDPA's ``attn_mask`` (``torch.nn.attention.bias.causal_upper_left(L, S)`` and
    ``causal_lower_right(L, S)``): a causal call, aligned top-left or bottom-right, which attention() takes as
    ``is_causal=True`` with that ``causal_align``. Its lengths must be q's and k's; ``is_causal`` or another
    ``causal_align`` beside it is refused by name, as torch refuses an attn_mask with is_causal."""
    if is_causal:
        raise ValueError("attn_mask (torch's CausalBias) and is_causal=True: pass one (torch's SDPA refuses both)")
    align = "bottom-right" if attn_mask.variant == sys.modules[_BIAS_MODULE].CausalVariant.LOWER_RIGHT else "top-left"
    if causal_align != "top-left" and causal_align != align:
        raise ValueError(f"causal_align={causal_align!r} and attn_mask=torch's CausalBias ({attn_mask.variant.name}, "
                         f"which is {align!r}): pass one")
    if isinstance(q, Tensor) and q.is_nested or isinstance(k, Tensor) and k.is_nested:
        raise ValueError(f"attn_mask is torch's CausalBias, of fixed lengths L={attn_mask.seq_len_q}, "
                         f"S={attn_mask.seq_len_kv}, and q, k are nested: pass is_causal=True (with causal_align="
                         f"{align!r}), which aligns the causal mask within each sequence")
    if isinstance(q, Tensor) and isinstance(k, Tensor) and q.dim() >= 2 and k.dim() >= 2:
        L, S = q.shape[-2], k.shape[-2]
        if (attn_mask.seq_len_q, attn_mask.seq_len_kv) != (L, S):
            raise ValueError(f"attn_mask is torch's CausalBias for L={attn_mask.seq_len_q}, S={attn_mask.seq_len_kv}, "
                             f"but q has L={L} and k has S={S}")
    return align
