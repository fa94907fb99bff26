"""Partial attention: the output and log-sum-exp of attention over one part of the keys, and the
merge of such parts, for attention whose keys arrive in pieces (ring attention).

:func:`partial_attention` runs PyTorch's fused kernels that return the log-sum-exp, the ones
PyTorch's own context parallelism calls: on the CPU the flash kernel
(``aten._scaled_dot_product_flash_attention_for_cpu``, every float dtype), on CUDA the flash
kernel (``aten._scaled_dot_product_flash_attention``) for float16 / bfloat16 parts with no bias
(about 3x the memory-efficient kernel's speed on an H100: docs/distributed.md) and the
memory-efficient kernel (``aten._scaled_dot_product_efficient_attention``) for the rest in
float32 / float16 / bfloat16. Anything else (float64 on CUDA, other devices, or ``FUSED = False``) takes the same
arithmetic in plain PyTorch, which is also what the fused path is tested against.
:func:`partial_attention_backward` gives one part's gradients from the merged output and
log-sum-exp, with the kernels' backward ops.

Conventions: ``q`` (B, H, Lq, E), ``k`` (B, H, Lk, E), ``v`` (B, H, Lk, Ev) with equal head counts;
``bias`` None or additive (B or 1, 1, Lq, Lk) in q's dtype, -inf where a key is ruled out. A query
with no allowed key in the part gets output 0 and log-sum-exp -inf (the kernels give 0 and 0
there; we set -inf, so that merging gives it no weight). Log-sum-exps are float32 (float64 for
float64 inputs), natural log, of the scaled scores.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .backends.common import LSE_RESOLVED_BOUND, beyond_resolution
from .precision import accumulation_dtype

__all__ = ["FUSED", "fused", "partial_attention", "partial_attention_trusted", "partial_attention_backward",
           "merge_partial"]

FUSED = True  # False: always the plain-PyTorch arithmetic (tests compare the two)
_ALIGN = 16  # the CUDA memory-efficient kernel wants the bias's rows 16-element aligned
_LSE_PAD = 32  # ... and keeps its log-sum-exp padded to a multiple of 32 queries


def fused(q: Tensor) -> str | None:
    """Which fused kernels :func:`partial_attention` uses for ``q``: "cpu-flash", "cuda" (flash or
    memory-efficient, part by part), or None (plain PyTorch)."""
    if not FUSED:
        return None
    if q.is_cpu and q.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        return "cpu-flash"
    if q.is_cuda and q.dtype in (torch.float32, torch.bfloat16, torch.float16):
        return "cuda"
    return None


def _cuda_flash(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, is_causal: bool) -> bool:
    """Whether a CUDA part goes to the flash kernel: half types, no bias, one head size (a multiple
    of 8, at most 256) for q, k and v, and ``is_causal`` only on a square part (flash aligns a
    non-square causal mask bottom-right)."""
    E = q.shape[-1]
    return (bias is None and q.dtype in (torch.float16, torch.bfloat16) and E == k.shape[-1] == v.shape[-1]
            and E % 8 == 0 and E <= 256 and (not is_causal or q.shape[2] == k.shape[2]))


def _cuda_bias(bias: Tensor | None, q: Tensor, k: Tensor) -> Tensor | None:
    """``bias`` expanded to (B, H, Lq, Lk) with rows aligned as the CUDA kernel requires (as
    ``scaled_dot_product_attention`` prepares it)."""
    if bias is None:
        return None
    Lk = k.shape[2]
    pad = (-Lk) % _ALIGN
    if pad:
        bias = F.pad(bias, (0, pad))[..., :Lk]
    return bias.expand(q.shape[0], q.shape[1], q.shape[2], Lk)


def _no_key(bias: Tensor | None, like: Tensor) -> Tensor | None:
    """(B or 1, 1, Lq) True where a query has no allowed key in this part; None when every query has one."""
    if bias is None:
        return None
    return torch.isinf(bias).all(-1) if bias.shape[-1] else torch.ones(bias.shape[:-1], dtype=torch.bool,
                                                                        device=like.device)


def _top_left(q: Tensor, k: Tensor) -> Tensor:
    """(Lq, Lk) True where key j <= query i: the kernels' ``is_causal``."""
    return torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()


def _heads_inner(x: Tensor) -> Tensor:
    """(B, H, L, E) laid out in memory as (B, L, H, E), the layout of the forward kernel's own output
    (what ``scaled_dot_product_attention``'s backward hands the backward kernel)."""
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def _padded(x: Tensor, size: int) -> Tensor:
    """``x`` with its last dim zero-padded to ``size`` (the CPU flash kernel wants one head size
    for q, k and v; zero features change no score and no output column)."""
    return x if x.shape[-1] == size else F.pad(x, (0, size - x.shape[-1]))


def partial_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, bias: Tensor | None = None,
                      is_causal: bool = False) -> tuple[Tensor, Tensor]:
    """(output (B, H, Lq, Ev), log-sum-exp (B, H, Lq)) of attention of ``q`` over this part's keys
    (the output in q's dtype from a fused kernel, in the accumulator dtype from plain PyTorch).
    ``is_causal``: key j allowed for query i when j <= i (top-left), on top of ``bias``.

    A bias that puts some row's largest finite entry beyond +-``LSE_RESOLVED_BOUND`` (64) is refused
    unless the inputs are float64: the float32 log-sum-exp of such a row (a -1e9 on every key) rounds
    off its whole content, and merging parts by it weighs them wrongly (output errors of order 1).
    Rule keys out with -inf, or subtract the row's maximum from the bias first."""
    if bias is not None and bias.shape[-1] and accumulation_dtype(q.dtype) != torch.float64:
        top = bias.amax(dim=-1)
        beyond = beyond_resolution(top)
        if bool(beyond.any()):
            raise ValueError(f"bias: some row's largest finite entry is {float(top[beyond].abs().max()):.3g} "
                             f"in magnitude, beyond the +-{LSE_RESOLVED_BOUND:g} that a float32 log-sum-exp resolves "
                             "(merged parts would be weighed wrongly); rule keys out with -inf, or subtract each "
                             "row's maximum from the bias")
    return partial_attention_trusted(q, k, v, scale, bias, is_causal)


def partial_attention_trusted(q: Tensor, k: Tensor, v: Tensor, scale: float, bias: Tensor | None = None,
                              is_causal: bool = False) -> tuple[Tensor, Tensor]:
    """:func:`partial_attention` for callers whose bias holds only 0 and -inf (ring attention builds
    its own from masks): the bias is not looked at again (on CUDA the look is a device sync a block)."""
    kernel = fused(q)
    if kernel == "cpu-flash":
        if is_causal and bias is not None:  # the CPU kernel takes one or the other
            bias = bias.masked_fill(~_top_left(q, k), float("-inf"))
            is_causal = False
        size = max(q.shape[-1], v.shape[-1])
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            _padded(q, size), _padded(k, size), _padded(v, size), 0.0, is_causal, attn_mask=bias, scale=scale)
        out = out[..., :v.shape[-1]]
    elif kernel == "cuda" and _cuda_flash(q, k, v, bias, is_causal):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal, False, scale=scale)[:2]
        lse = lse[..., :q.shape[2]]
    elif kernel == "cuda":
        out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, _cuda_bias(bias, q, k), True, 0.0, is_causal, scale=scale)
        lse = lse[..., :q.shape[2]]
    else:
        s = (q @ k.transpose(-1, -2)).to(accumulation_dtype(q.dtype)) * scale
        if bias is not None:
            s = s + bias
        if is_causal:
            s = s.masked_fill(~_top_left(q, k), float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
        return torch.exp(s - safe[..., None]) @ v.to(s.dtype), lse
    empty = _no_key(bias, q)
    if empty is not None:
        lse = lse.masked_fill(empty, float("-inf"))
        out = out.masked_fill(empty[..., None], 0.0)
    return out, lse.to(accumulation_dtype(q.dtype))


def merge_partial(out: Tensor, lse: Tensor, part_out: Tensor, part_lse: Tensor) -> tuple[Tensor, Tensor]:
    """Merge one part's (output, log-sum-exp) into the running (``out``, ``lse``) (accumulator
    dtype): the result is attention over the union of the keys. Rows with no key on either side
    stay 0 and -inf."""
    merged = torch.logaddexp(lse, part_lse)
    safe = torch.where(torch.isinf(merged), torch.zeros_like(merged), merged)
    out = out * torch.exp(lse - safe)[..., None] + part_out.to(out.dtype) * torch.exp(part_lse - safe)[..., None]
    return out, merged


def partial_attention_backward(d_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                               scale: float, bias: Tensor | None = None,
                               is_causal: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients (dq, dk, dv) of this part, given the merged ``out`` and ``lse`` over all the keys
    (so that the parts' gradients add up to the whole's). ``lse`` must be finite: pass 0 for rows
    with no key anywhere (their ``out`` is 0 and every score -inf, so they contribute nothing)."""
    kernel = fused(q)
    if kernel == "cpu-flash":
        if is_causal and bias is not None:
            bias = bias.masked_fill(~_top_left(q, k), float("-inf"))
            is_causal = False
        size, E, Ev = max(q.shape[-1], v.shape[-1]), q.shape[-1], v.shape[-1]
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            _padded(d_out.to(q.dtype), size), _padded(q, size), _padded(k, size), _padded(v, size),
            _padded(out.to(q.dtype), size), lse.to(accumulation_dtype(q.dtype)).contiguous(), 0.0, is_causal,
            attn_mask=bias, scale=scale)
        return dq[..., :E], dk[..., :E], dv[..., :Ev]
    if kernel == "cuda" and _cuda_flash(q, k, v, bias, is_causal):
        unused = torch.zeros((), dtype=torch.int64)  # dropout seed / offset: no dropout
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
            _heads_inner(d_out.to(q.dtype)), q, k, v, _heads_inner(out.to(q.dtype)), lse.float().contiguous(),
            None, None, q.shape[2], k.shape[2], 0.0, is_causal, unused, unused, scale=scale)
        return dq, dk, dv
    if kernel == "cuda":
        padded = F.pad(lse.float(), (0, (-q.shape[2]) % _LSE_PAD)).contiguous()
        unused = torch.zeros((), dtype=torch.int64)  # dropout seed / offset: no dropout
        dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            _heads_inner(d_out.to(q.dtype)), q, k, v, _cuda_bias(bias, q, k), _heads_inner(out.to(q.dtype)), padded,
            unused, unused, 0.0, [True, True, True, False], is_causal, scale=scale)
        return dq, dk, dv
    acc = accumulation_dtype(q.dtype)
    qa, ka, va, do = q.to(acc), k.to(acc), v.to(acc), d_out.to(acc)
    s = (qa @ ka.transpose(-1, -2)) * scale
    if bias is not None:
        s = s + bias
    if is_causal:
        s = s.masked_fill(~_top_left(q, k), float("-inf"))
    p = torch.exp(s - lse[..., None])
    delta = (do * out.to(acc)).sum(-1, keepdim=True)
    ds = p * (do @ va.transpose(-1, -2) - delta)
    return (ds @ ka) * scale, (ds.transpose(-1, -2) @ qa) * scale, p.transpose(-1, -2) @ do
