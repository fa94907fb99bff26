"""Ragged sequences as torch.nested tensors (the jagged layout), as torch's SDPA takes them.

q (B, H, j, E), k (B, Hkv, j', E) and v (B, Hkv, j', Ev) are jagged nested tensors whose ragged dim is the length:
``torch.nested.nested_tensor([...], layout=torch.jagged)`` of (L_b, H, E) sequences, transposed to put the heads
first, as torch's SDPA tutorial builds them. :func:`attention` pads each sequence to the longest, masks the padded
keys, runs :func:`attnkit.attention` on the padded tensors (every backend, the NaN rule where it is on, gradients) and returns the
output as a jagged tensor with q's own offsets (so that ``x + output`` works on q's sequences). A causal call or a
window is aligned within each sequence (top-left, or bottom-right at S_b - L_b), which torch's own CPU kernels for
nested tensors do not take. A mask or a bias (padded shapes would be ambiguous), weights and the lse (ragged in two
dims) are refused with a named error; so is torch's older strided layout.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .checks import check_window

__all__ = ["any_nested", "attention"]

REFUSED = ("mask", "bias", "attn_mask", "need_weights", "return_lse")
"""attention()'s arguments that a call of nested tensors refuses (with the reason in the error)."""


def any_nested(q, k, v) -> bool:
    """Whether any of q, k and v is a nested tensor (any layout); False for anything that is not a tensor."""
    return any(isinstance(x, Tensor) and x.is_nested for x in (q, k, v))


def _jagged(name: str, x, expected: str) -> Tensor:
    if not isinstance(x, Tensor) or not x.is_nested:
        got = f"a dense tensor of shape {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"{name} must be a nested tensor like the others {expected}, got {got}")
    if x.layout != torch.jagged:
        raise TypeError(f"{name} is a nested tensor of layout {x.layout}; attention() takes torch.jagged "
                        "(torch.nested.nested_tensor(sequences, layout=torch.jagged), torch's recommended layout)")
    if x.dim() != 4 or x._ragged_idx != 2:  # type: ignore[attr-defined]  # (torch's NestedTensor)
        raise ValueError(f"{name} must be a jagged tensor {expected} with the ragged length at dim 2 (sequences of "
                         f"(L_b, H, E) nested and transposed with .transpose(1, 2)), got shape {tuple(x.shape)} "
                         f"ragged at dim {x._ragged_idx}")  # type: ignore[attr-defined]
    return x


def _padded(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The jagged (B, H, j, D) ``x`` as a padded (B, H, Lmax, D) tensor (zeros past each length), its
    (B,) lengths and the (B, Lmax) positions that hold a row."""
    offsets = x.offsets()  # type: ignore[attr-defined]
    lengths = offsets.diff()
    longest = int(lengths.max()) if lengths.numel() else 0  # one read on the host (a wait on a device)
    rows = torch.arange(longest, device=lengths.device) < lengths[:, None]
    values = x.transpose(1, 2).values()  # (total, H, D), differentiable
    padded = values.new_zeros(len(lengths), longest, *values.shape[1:]).index_put((rows,), values)
    return padded.transpose(1, 2), lengths, rows


def attention(function, q, k, v, *, is_causal, causal_align: str, window, options: dict):
    """:func:`attnkit.attention` (``function``) over nested q, k and v (the module). ``options`` holds the call's
    other arguments, passed through; the ones in :data:`REFUSED` must be unset (None or False)."""
    for name in REFUSED:
        given = options.pop(name, None)
        if given is not None and given is not False:
            raise ValueError(f"{name}= is not taken with nested q, k and v: their padded shapes would be ambiguous "
                             f"(a mask, a bias) or ragged in two dims (weights, the lse); pass dense tensors "
                             f"(x.to_padded_tensor(0.0)) with a padding mask instead")
    q = _jagged("q", q, "(B, H, j, E)")
    k = _jagged("k", k, "(B, Hkv, j, E)")
    v = _jagged("v", v, "(B, Hkv, j, Ev)")
    if k.offsets() is not v.offsets() and not torch.equal(k.offsets(), v.offsets()):
        raise ValueError("k and v must hold sequences of the same lengths (their offsets differ)")
    if len(k.offsets()) != len(q.offsets()):
        raise ValueError(f"q and k must hold as many sequences: q has {len(q.offsets()) - 1}, "
                         f"k {len(k.offsets()) - 1}")
    qp, q_lengths, q_rows = _padded(q)
    kp, k_lengths, _ = _padded(k)
    vp, _, _ = _padded(v)
    allowed = torch.arange(kp.shape[2], device=kp.device) < k_lengths[:, None, None]  # (B, 1, S): its own keys
    if causal_align == "bottom-right" and (is_causal or window is not None):  # aligned at S_b - L_b: in the mask
        check_window(window)
        i = torch.arange(qp.shape[2], device=qp.device)[:, None]
        j = i + (k_lengths - q_lengths)[:, None, None] - torch.arange(kp.shape[2], device=kp.device)  # i + offset - j
        allowed = allowed & (j >= 0) & (True if window is None else j < window)  # (B, L, S)
        is_causal, causal_align, window = False, "top-left", None
    # top-left: a sequence's own positions are the padded ones, and attention() aligns the causal mask and window
    result = function(qp, kp, vp, mask=allowed[:, None], is_causal=is_causal, causal_align=causal_align,
                      window=window, **options)
    values = result.output.transpose(1, 2)[q_rows]  # (total, H, Ev): each sequence's own rows
    output = torch.nested.nested_tensor_from_jagged(values, offsets=q.offsets()).transpose(1, 2)
    return result._replace(output=output)
