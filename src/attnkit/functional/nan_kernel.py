"""The NaN rule on CUDA as one Triton kernel, where the rule does not look first (:func:`.nan.looks_first`).

Without a look, :func:`.nan.poisoned_rows` and a ``where`` cost seven kernel launches a call: three maxima over q, k
and v, two ``maximum``, an ``isnan`` and the ``where`` that rewrites the output (eight with grouped heads, whose
keys' maxima are repeated per query head). For a tiny call, a decoding step
among them, the launches are the call: on an H200 (torch 2.11) they made a 16 us SDPA call 112 us
(benchmarks/results/gpu/2026-11-27_ninth/). Here one program per (batch, query head) reads that head's query rows
and its key/value head's keys and values once, and writes NaN over the output rows the rule poisons, in place; where
nothing is poisoned (the common case) it writes nothing. It is the same rule, row for row (tests/gpu/
test_nan_rule_cuda.py on the GPU; tests/functional/test_nan_kernel.py through Triton's interpreter on the CPU).

It runs only where writing in place is safe and the result is the same as the seven kernels': no autograd graph to
keep (the ``where`` gives the poisoned rows a zero gradient), not compiling (a Triton call is no graph node here),
the output a tensor of its own (no storage shared with q, k or v; contiguous in (B, H, L, Ev) or (B, L, H, Ev)
order), every last dimension contiguous, head sizes up to :data:`MAX_HEAD_DIM`, at most
:data:`PROGRAM_MAX_BYTES` for one program to read, on the current CUDA device, an NVIDIA GPU Triton compiles for
(compute capability 7.0 on), and Triton importable. Elsewhere the caller runs the seven kernels, as before.

Measured on an H200 (benchmarks/results/gpu/2026-11-28_thirteenth/first_call/nan_kernel_sizes.json, bf16, calls back
to back): one program per (batch, head) reads its head's rows one block after another, so its time grows with what one
program reads, where the seven kernels' stay near their launches' host time (113-144 us there). The kernel took 21 us
for a tiny call, 56 us at 0.375 MiB a program, 71 us at 0.5 MiB, 214 us at 1.5 MiB and 271 us at 2 MiB: it wins up to
about 1 MiB, where :data:`PROGRAM_MAX_BYTES` stops it, and the seven kernels run beyond. A design that needs no
GPU-wide barrier, and would take larger calls, has these steps:
- a grid over (batch, head, row block);
- each program writes NaN over its own poisoned query rows;
- the first head of a group scans its block of keys and values. Where it finds a NaN, it writes NaN over every row
  of the group's heads. Every write is a NaN, so the order does not matter.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from .checks import Dims
from .tracing import traced

MAX_HEAD_DIM = 512
"""Widest head (E or Ev) the kernel takes: it holds a block of rows by the whole head, rounded up to a power of two."""

PROGRAM_MAX_BYTES = 2**20
"""Most bytes one program may read: its head's queries and its key/value head's keys and values. A call beyond it
(few heads, long sequences: a decoding step over 8K keys of 2 key/value heads reads 4 MiB a program) runs the
seven kernels, which spread over the GPU, where one program would read its share alone. The measured crossing: the
kernel 1.9x faster than the seven at 0.5 MiB a program, 0.64x at 1.5 MiB (H200, bf16; the module docstring)."""


_INTS = ("H", "G", "L", "S", "E", "EV", "sqb", "sqh", "sql", "skb", "skh", "sks", "svb", "svh", "svs", "sob", "soh", "sol")
"""The kernel's integer arguments, in order after its four pointers."""

FAST_LAUNCH = True
"""Launch a kept compiled kernel (Triton's ``CompiledKernel[grid](...)``) instead of calling the jitted function,
whose ``run`` binds and specialises every argument and builds a cache key on each call (Triton 3.6, measured: the
one kernel's launch was 30-35 us of host time on an H200's host beside SDPA's 14-15 us,
benchmarks/results/gpu/2026-11-27_ninth/). Used with Triton 3.6, the version it was written against; other versions,
and ``FAST_LAUNCH = False``, call the jitted function."""

_COMPILED: dict[tuple, Any] = {}
"""Compiled kernels by (dtypes of q, k, v and the output, block sizes, device index), for :data:`FAST_LAUNCH`."""


@functools.cache
def _fast_launch_known() -> bool:
    import triton
    return triton.__version__.startswith("3.6.")


@functools.cache
def _kernel():
    """The jitted kernel, or None where Triton cannot be imported (CPU-only PyTorch builds ship without it)."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    # nothing specialised on values or alignment: one compiled kernel per dtypes and block sizes serves every call,
    # so that launch() can keep it and skip Triton's per-call binding (_COMPILED)
    @triton.jit(do_not_specialize=list(_INTS), do_not_specialize_on_alignment=["q", "k", "v", "out"])
    def poison_rows(q, k, v, out, H, G, L, S, E, EV,
                    sqb, sqh, sql, skb, skh, sks, svb, svh, svs, sob, soh, sol,
                    ROWS: tl.constexpr, BE: tl.constexpr, BEV: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        b = pid // H
        h = pid % H
        hk = h // G  # query head h reads key/value head h // G: the groups are consecutive
        rows = tl.arange(0, ROWS)
        ce = tl.arange(0, BE)
        cev = tl.arange(0, BEV)
        # any NaN in the keys or values of (b, hk) poisons every row of the query heads that read them
        kv_nan = tl.zeros([ROWS], dtype=tl.int32)
        k_at = k + b * skb + hk * skh
        v_at = v + b * svb + hk * svh
        for s0 in range(0, S, ROWS):
            r = s0 + rows
            x = tl.load(k_at + r[:, None] * sks + ce[None, :], mask=(r[:, None] < S) & (ce[None, :] < E),
                        other=0.0).to(tl.float32)
            kv_nan = kv_nan | tl.max((x != x).to(tl.int32), axis=1)
            y = tl.load(v_at + r[:, None] * svs + cev[None, :], mask=(r[:, None] < S) & (cev[None, :] < EV),
                        other=0.0).to(tl.float32)
            kv_nan = kv_nan | tl.max((y != y).to(tl.int32), axis=1)
        any_kv = tl.max(kv_nan, axis=0)
        q_at = q + b * sqb + h * sqh
        o_at = out + b * sob + h * soh
        zero = tl.zeros([ROWS, BEV], dtype=tl.float32)
        nan = (zero / zero).to(out.dtype.element_ty)
        for l0 in range(0, L, ROWS):
            r = l0 + rows
            x = tl.load(q_at + r[:, None] * sql + ce[None, :], mask=(r[:, None] < L) & (ce[None, :] < E),
                        other=0.0).to(tl.float32)
            bad = (tl.max((x != x).to(tl.int32), axis=1) | any_kv) != 0
            tl.store(o_at + r[:, None] * sol + cev[None, :], nan,
                     mask=bad[:, None] & (r[:, None] < L) & (cev[None, :] < EV))

    return poison_rows


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def launch(q: Tensor, k: Tensor, v: Tensor, dims: Dims, output: Tensor) -> None:
    """Write NaN over the rows of ``output`` (B, H, L, Ev) that the NaN rule poisons, in place, in one kernel.
    The caller settled :func:`applies` (tests call it directly, on the CPU through Triton's interpreter)."""
    kernel = _kernel()
    assert kernel is not None
    be, bev = _pow2(dims.E), _pow2(dims.Ev)
    rows = max(4, min(64, 4096 // max(be, bev)))
    # (B, H, L) strides of each: Tensor.stride() once each (a tuple) costs a quarter of stride(i) twelve times
    ints = (dims.H, dims.groups, dims.L, dims.S, dims.E, dims.Ev,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *output.stride()[:3])
    grid = (dims.B * dims.H, 1, 1)
    # a kept kernel takes 32-bit integers: Triton types a larger one as 64-bit, another compiled kernel
    fast = FAST_LAUNCH and output.is_cuda and max(ints) < 2**31 and _fast_launch_known()
    key = (q.dtype, k.dtype, v.dtype, output.dtype, rows, be, bev, output.device.index)
    compiled = _COMPILED.get(key) if fast else None
    if compiled is not None:
        compiled[grid](q, k, v, output, *ints, rows, be, bev)  # the launcher takes the constexprs too, and skips them
        return
    compiled = kernel[grid](q, k, v, output, *ints, ROWS=rows, BE=be, BEV=bev)
    if fast:
        _COMPILED[key] = compiled


def poisoned_in_place(q: Tensor, k: Tensor, v: Tensor, dims: Dims, output: Tensor) -> bool:
    """Where :func:`applies`, the NaN rule's rows of ``output`` written over in place by one kernel (:func:`launch`)
    and True; else False, and the caller runs the seven kernels."""
    if not applies(q, k, v, dims, output):
        return False
    launch(q, k, v, dims, output)
    return True


def applies(q: Tensor, k: Tensor, v: Tensor, dims: Dims, output: Tensor) -> bool:
    """Whether :func:`launch` may stand for the seven kernels on this CUDA call (the module's conditions)."""
    if (not 0 < dims.E <= MAX_HEAD_DIM or not 0 < dims.Ev <= MAX_HEAD_DIM or not dims.L or not dims.B or not dims.H
            or traced() or (output.requires_grad and torch.is_grad_enabled())):
        return False
    if (dims.L * dims.E + dims.S * (dims.E + dims.Ev)) * q.element_size() > PROGRAM_MAX_BYTES:
        return False
    if q.stride()[3] != 1 or k.stride()[3] != 1 or v.stride()[3] != 1:
        return False
    # SDPA's two layouts, (B, H, L, Ev) and (B, L, H, Ev) contiguous, where no two rows share memory: their strides
    # first (arithmetic), is_contiguous() for what else such a tensor may carry on a dimension of size 1 (a
    # transposed view for the second: 2.8 us on the CPU, where the strides' comparison is a tenth of that)
    H, L, Ev = dims.H, dims.L, dims.Ev
    strides = output.stride()
    if (strides != (H * L * Ev, L * Ev, Ev, 1) and strides != (L * H * Ev, Ev, H * Ev, 1)
            and not (output.is_contiguous() or output.transpose(1, 2).is_contiguous())):
        return False
    storage = output.untyped_storage().data_ptr()
    if storage in (q.untyped_storage().data_ptr(), k.untyped_storage().data_ptr(), v.untyped_storage().data_ptr()):
        return False
    device = output.get_device()
    return device == torch.cuda.current_device() and _compiles_for(device)


@functools.cache
def _compiles_for(device: int) -> bool:
    """Whether the kernel can run on CUDA device ``device``: Triton importable, an NVIDIA GPU of compute capability
    7.0 or newer (Triton's floor, as torch.compile checks it; ROCm builds, whose Triton this kernel was never run
    on, keep the seven kernels)."""
    return (torch.version.hip is None and torch.cuda.get_device_capability(device) >= (7, 0)
            and _kernel() is not None)
