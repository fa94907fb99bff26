"""Rows with no allowed key, as transformers' eager attention computes them.

attnkit's own :func:`attnkit.attention` gives such a row zeros. Eager masks with ``finfo.min``
added to the scores, so every score of a row with no allowed key rounds to the same value and its
softmax is uniform: the row averages the values of all S keys, and autograd differentiates that
softmax at the uniform point (the q, k and v of the row get gradients). Inside the bridge attnkit
returns exactly that, forward and backward, so that a left-padded batch whose first labels are not
masked trains as eager does:

    p = softmax(t - sg(t)),  t = f(scores) (+ a learned bias),  output = p v

where sg stops gradients (forward: p = 1/S; backward: softmax's Jacobian at 1/S), f is Gemma 2's
softcapping where the model has it. Without softcapping or a learned bias the rows need no scores:

    output = mean_j v_j + scale (q M - sg(q M)),  M = sum_j k_j sg(v_j - mean v)^T / S

(E x Ev per key/value head), computed for every row and selected where a row is empty, with no
look at the device. Otherwise the empty rows are gathered and computed as above (one look).
A model with learned sinks (gpt-oss) needs nothing: eager's sink takes the whole row, zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["EmptyRows", "structured_empty_rows", "mask_empty_rows", "as_eager"]


@dataclass(frozen=True)
class EmptyRows:
    """(B|1, H|1, L) True where a query row has no allowed key and eager averages every key."""

    rows: Tensor


def structured_empty_rows(padding: Tensor | None, L: int, S: int, *, causal: bool, window: int | None,
                          offset: int) -> EmptyRows | None:
    """Rows with no key under a structure (causal with ``offset``: key j allowed for query i iff
    i + offset - window < j <= i + offset; or bidirectional) and a (B, 1, 1, S) padding mask:
    counted with a prefix sum over the padding, O(B (L + S)), never an (L, S) mask. None where the
    structure alone leaves every row a key and there is no padding."""
    device = padding.device if padding is not None else torch.device("cpu")
    if not causal:
        if padding is None:
            return None
        return EmptyRows(rows=(~padding.any(dim=-1)).expand(-1, -1, L))  # (B, 1, L)
    rows = torch.arange(L, device=device)
    hi = (rows + offset + 1).clamp(0, S)  # keys [lo, hi) are allowed by the structure
    lo = torch.zeros_like(hi) if window is None else (rows + offset - window + 1).clamp(0, S)
    if padding is None:
        if offset >= 0 and (window is None or window >= 1):
            return None  # every row sees at least its aligned key
        return EmptyRows(rows=(hi <= lo)[None, None])
    real = torch.nn.functional.pad(padding[:, 0, 0].to(torch.int32).cumsum(dim=-1), (1, 0))  # (B, S + 1)
    counts = real[:, hi] - real[:, lo]  # (B, L) real keys in [lo, hi)
    return EmptyRows(rows=(counts <= 0)[:, None])


def mask_empty_rows(mask: Tensor | None, bias: Tensor | None) -> EmptyRows | None:
    """Rows eager averages uniformly, from a mask transformers built (boolean, True = attend) or a
    user's additive one: no allowed key, and for an additive mask no -inf in the row either (eager
    gives NaN for a row of -inf; a row mixing -inf and finfo.min keeps attnkit's zeros)."""
    if mask is not None:
        return EmptyRows(rows=~mask.any(dim=-1))
    if bias is not None:
        masked = bias <= torch.finfo(bias.dtype).min / 2
        return EmptyRows(rows=masked.all(dim=-1) & ~torch.isneginf(bias).any(dim=-1))
    return None


def as_eager(output: Tensor, weights: Tensor | None, empty: EmptyRows, query: Tensor, key: Tensor, value: Tensor,
             scale: float, *, softcap: float | None = None, bias: Tensor | None = None,
             heads: list[int] | None = None) -> tuple[Tensor, Tensor | None]:
    """``output`` (B, H, L, Ev) and ``weights`` (B, h, L, S) (of ``heads``, all when None) with the
    empty rows replaced by eager's uniform rows, gradients included. ``bias`` (B|1, H, L, S): an
    additive term that needs gradients (T5's relative position bias)."""
    rows = empty.rows
    if query.device.type == "cpu" and not torch.compiler.is_compiling() and not bool(rows.any()):
        return output, weights
    S = key.shape[2]
    if softcap is None and (bias is None or not bias.requires_grad):
        output = torch.where(rows[..., None], _uniform_rows(query, key, value, scale), output)
    else:
        output = _gathered_rows(output, rows, query, key, value, scale, softcap, bias)
    if weights is not None:
        chosen = rows if rows.shape[1] == 1 or heads is None else rows[:, heads]
        weights = torch.where(chosen[..., None], torch.full((), 1.0 / S, dtype=weights.dtype), weights)
    return output, weights


def _uniform_rows(query: Tensor, key: Tensor, value: Tensor, scale: float) -> Tensor:
    """(B, H, L, Ev): every row as if it had no allowed key (module docstring), without scores."""
    B, H, L, E = query.shape
    Hkv, S = key.shape[1], key.shape[2]
    mean = value.mean(dim=2, keepdim=True)  # (B, Hkv, 1, Ev)
    moment = key.transpose(-1, -2) @ ((value - mean).detach() / S)  # (B, Hkv, E, Ev)
    t = (query.unflatten(1, (Hkv, H // Hkv)) @ moment[:, :, None]) * scale  # (B, Hkv, G, L, Ev)
    return (mean[:, :, None] + (t - t.detach())).flatten(1, 2)


def _gathered_rows(output: Tensor, rows: Tensor, query: Tensor, key: Tensor, value: Tensor, scale: float,
                   softcap: float | None, bias: Tensor | None) -> Tensor:
    """``output`` with the empty rows computed one by one from their scores (module docstring)."""
    B, H, L, _ = query.shape
    groups = H // key.shape[1]
    b, h, i = rows.expand(B, H, L).nonzero(as_tuple=True)
    if b.numel() == 0:
        return output
    scores = (key[b, h // groups] @ query[b, h, i][..., None]).squeeze(-1) * scale  # (n, S)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias[b if bias.shape[0] > 1 else 0, h, i].to(scores.dtype)
    p = torch.softmax(scores - scores.detach(), dim=-1)  # 1/S, with softmax's gradient at 1/S
    rows_out = (p[:, None] @ value[b, h // groups]).squeeze(1)  # (n, Ev)
    return output.index_put((b, h, i), rows_out.to(output.dtype))
