"""Rows with no allowed key, as transformers' eager attention computes them.

attnkit's own :func:`attnkit.attention` gives such a row zeros. Eager masks with ``finfo.min``
added to the scores, so every score of such a row rounds to the row's largest mask value and its
softmax is uniform over the keys holding that value (all S keys under transformers' own masks; under
a user's mask mixing -inf and ``finfo.min``, the ``finfo.min`` keys): the row averages their values,
and autograd differentiates that softmax at the uniform point (the q, k and v of the row get
gradients, and so do the returned weights). Inside the bridge attnkit returns exactly that, forward
and backward, so that a left-padded batch whose first labels are not masked trains as eager does:

    p = softmax(t - sg(t)) over the row's keys,  t = f(scores) (+ a learned bias),  output = p v

where sg stops gradients (forward: p uniform; backward: softmax's Jacobian there), f is Gemma 2's
softcapping where the model has it. Where the row averages all S keys and nothing needs p's own
gradient (no softcapping, no learned bias, no weights to differentiate) the rows need no scores:

    output = mean_j v_j + scale (q M - sg(q M)),  M = sum_j k_j sg(v_j - mean v)^T / S

(E x Ev per key/value head), computed for every row and selected where a row is empty, with no
look at the device. Otherwise the empty rows are gathered and computed as above (one look).
Eager gives NaN only where every key of a row is -inf; attnkit keeps zeros there.
A model with learned sinks (gpt-oss) needs nothing: eager's sink takes the whole row, zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..functional.tracing import traced

__all__ = ["EmptyRows", "structured_empty_rows", "mask_empty_rows", "as_eager"]


@dataclass(frozen=True)
class EmptyRows:
    """``rows`` (B|1, H|1, L): True where a query row has no allowed key and eager averages keys instead;
    ``keys`` (B|1, H|1, L|1, S): the keys it averages there, None for all S."""

    rows: Tensor
    keys: Tensor | None = None


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
    """Rows eager averages, from a mask transformers built (boolean, True = attend: eager's own mask
    puts ``finfo.min`` at every masked key, so it averages all S) or a user's additive one, read in the
    dtype it was given in (a float32 ``finfo.min`` stays a finite mask value in a bfloat16 model, as
    eager's type promotion keeps it): no allowed key, and some key not -inf (eager's NaN row); the
    keys averaged are those holding the row's largest value (``finfo.min`` beside -inf: a row mixing
    them averages its ``finfo.min`` keys)."""
    if mask is not None:
        return EmptyRows(rows=~mask.any(dim=-1))
    if bias is None:
        return None
    masked = bias <= torch.finfo(bias.dtype).min / 2
    rows = masked.all(dim=-1) & ~torch.isneginf(bias).all(dim=-1)
    averaged = bias == bias.amax(dim=-1, keepdim=True)  # where eager's rounding leaves the weight
    if bias.is_cpu and not traced() and bool((averaged | ~rows[..., None]).all()):
        return EmptyRows(rows=rows)  # every empty row averages all S keys (transformers' finfo.min masks)
    return EmptyRows(rows=rows, keys=averaged)


def as_eager(output: Tensor, weights: Tensor | None, empty: EmptyRows, query: Tensor, key: Tensor, value: Tensor,
             scale: float, *, softcap: float | None = None, bias: Tensor | None = None,
             heads: list[int] | None = None) -> tuple[Tensor, Tensor | None]:
    """``output`` (B, H, L, Ev) and ``weights`` (B, h, L, S) (of ``heads``, all when None) with the
    empty rows replaced by eager's rows, gradients included (the weights' too). ``bias`` (B|1, H, L, S):
    an additive term that needs gradients (T5's relative position bias)."""
    rows = empty.rows
    if query.is_cpu and not traced() and not bool(rows.any()):
        return output, weights
    learned = bias is not None and bias.requires_grad
    weights_train = weights is not None and torch.is_grad_enabled() and (query.requires_grad or key.requires_grad
                                                                         or learned)
    if softcap is None and not learned and empty.keys is None and not weights_train:
        output = torch.where(rows[..., None], _uniform_rows(query, key, value, scale), output)
        if weights is not None:
            chosen = rows if rows.shape[1] == 1 or heads is None else rows[:, heads]
            weights = torch.where(chosen[..., None], torch.full((), 1.0 / key.shape[2], dtype=weights.dtype), weights)
        return output, weights
    return _gathered_rows(output, weights, empty, query, key, value, scale, softcap, bias, heads)


def _uniform_rows(query: Tensor, key: Tensor, value: Tensor, scale: float) -> Tensor:
    """(B, H, L, Ev): every row as if it had no allowed key (module docstring), without scores."""
    B, H, L, E = query.shape
    Hkv, S = key.shape[1], key.shape[2]
    mean = value.mean(dim=2, keepdim=True)  # (B, Hkv, 1, Ev)
    moment = key.transpose(-1, -2) @ ((value - mean).detach() / S)  # (B, Hkv, E, Ev)
    t = (query.unflatten(1, (Hkv, H // Hkv)) @ moment[:, :, None]) * scale  # (B, Hkv, G, L, Ev)
    return (mean[:, :, None] + (t - t.detach())).flatten(1, 2)


def _gathered_rows(output: Tensor, weights: Tensor | None, empty: EmptyRows, query: Tensor, key: Tensor,
                   value: Tensor, scale: float, softcap: float | None, bias: Tensor | None,
                   heads: list[int] | None) -> tuple[Tensor, Tensor | None]:
    """``output`` and ``weights`` with the empty rows computed one by one from their scores (module
    docstring); the weights of those rows are p itself, so a loss on them reaches q and k as eager's."""
    B, H, L, _ = query.shape
    groups = H // key.shape[1]
    b, h, i = empty.rows.expand(B, H, L).nonzero(as_tuple=True)
    if b.numel() == 0:
        return output, weights
    scores = (key[b, h // groups] @ query[b, h, i][..., None]).squeeze(-1) * scale  # (n, S)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias[b if bias.shape[0] > 1 else 0, h, i].to(scores.dtype)
    centred = scores - scores.detach()  # 0, with the scores' gradient
    if empty.keys is not None:
        keys = empty.keys
        members = keys[b if keys.shape[0] > 1 else 0, h if keys.shape[1] > 1 else 0, i if keys.shape[2] > 1 else 0]
        centred = centred.masked_fill(~members, float("-inf"))
    p = torch.softmax(centred, dim=-1)  # uniform over the row's keys, with softmax's gradient there
    rows_out = (p[:, None] @ value[b, h // groups]).squeeze(1)  # (n, Ev)
    output = output.index_put((b, h, i), rows_out.to(output.dtype))
    if weights is not None:
        if heads is None:
            weights = weights.index_put((b, h, i), p.to(weights.dtype))
        else:
            slot = torch.full((H,), -1, dtype=torch.long, device=h.device)
            slot[torch.tensor(heads, device=h.device)] = torch.arange(len(heads), device=h.device)
            kept = slot[h] >= 0
            weights = weights.index_put((b[kept], slot[h[kept]], i[kept]), p[kept].to(weights.dtype))
    return output, weights
