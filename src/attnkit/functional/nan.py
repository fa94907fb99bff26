"""The NaN rule (docs/semantics.md): NaN propagates one way in every backend.

A NaN in query row i makes that row's output, weights and lse NaN; a NaN anywhere in the keys or
values of a (batch, key/value head) makes every row of the query heads reading it NaN, whatever the
mask says. Fused kernels differ on their own (SDPA turns a NaN query into a zero output), so
:func:`attnkit.attention` finds the rows here and sets them after any backend.
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import Tensor

from . import compiled, nan_kernel
from .checks import Dims
from .heads import repeat_kv
from .tracing import is_compiling, traced, transformed

_on = True


@contextlib.contextmanager
def nan_rule(enabled: bool):
    """Within the block, :func:`attention` applies the NaN rule (``True``, the default) or not.

    The rule (docs/semantics.md) makes NaN propagate the same way in every backend. Where it looks
    first (:func:`looks_first`: the CPU, and CUDA calls of at least :data:`DEVICE_LOOK_MIN_BYTES`) it
    reads a plain call's output or q, k and v once and waits for the device; elsewhere on CUDA it launches one
    Triton kernel that reads q, k and v and writes NaN over the poisoned rows (:mod:`.nan_kernel`), or, where that
    kernel does not apply, seven kernels that rewrite the output; their cost shows where the attention itself is
    short (docs/performance.md).
    ``nan_rule(False)`` skips it: NaN then spreads as each backend's kernel lets it (a NaN in a
    masked key, for instance, may change nothing). The setting is global (every thread), restored
    on exit, and read at trace time by ``torch.compile`` (a change recompiles)."""
    if not isinstance(enabled, bool):
        raise TypeError(f"nan_rule(enabled) takes True or False, got {type(enabled).__name__} {enabled!r}")
    global _on
    previous, _on = _on, enabled
    try:
        yield
    finally:
        _on = previous


def on() -> bool:
    """Whether the rule applies now (:func:`nan_rule`)."""
    return _on


PLAIN_LOOK_MIN_KEYS = 64
"""The one look at a plain call's output stands for the rule from this many keys on where the CPU's vector
width is not known (:func:`plain_look_min_keys`). Below a vector's width SDPA's CPU kernels reduce a row with
instructions that drop a NaN: with AVX2 a NaN query row gives a finite output for S < 8 (float32, half types)
or S < 4 (float64), a NaN key for S = 1; AVX-512 doubles the widths. Shorter calls (the first decoding steps
among them) read q, k and v instead (:func:`poisoned_rows`)."""

_LANES = {"AVX512": 16, "AVX2": 8}
"""float32 lanes of the vector unit PyTorch's CPU kernels were dispatched to (``get_cpu_capability``); float64
has half as many. Seen on an AVX-512 machine (tests/functional/test_per_call.py sweeps every S from the
threshold on, every position of q, k and v, on whatever CPU runs it): SDPA drops a NaN for S < 16 (float32,
bfloat16, float16) and S < 8 (float64), and carries every one from there."""


def _min_keys() -> dict[torch.dtype, int]:
    lanes = _LANES.get(torch.backends.cpu.get_cpu_capability())
    if lanes is None:  # another vector unit (Arm's, or none): the width is unknown, the margin wide
        return {}
    return {torch.float64: lanes // 2, torch.float32: lanes, torch.bfloat16: lanes, torch.float16: lanes}


_MIN_KEYS = _min_keys()


def plain_look_min_keys(dtype: torch.dtype) -> int:
    """The fewest keys from which SDPA's CPU kernels carry every NaN of q, k or v into a plain call's output on
    this machine: one vector of ``dtype`` (twice as many float32 lanes for a half type's float32 arithmetic,
    :data:`_LANES`) on AVX2 and AVX-512, :data:`PLAIN_LOOK_MIN_KEYS` elsewhere."""
    return _MIN_KEYS.get(dtype, PLAIN_LOOK_MIN_KEYS)


DEVICE_LOOK_MIN_BYTES: float = 32 * 2**20
"""On CUDA, from this many bytes of q, k and v together, the rule looks before it acts, as it does on the CPU
(:func:`looks_first`): one look at a plain call's output, or the three whole-tensor maxima of q, k and v, and one
wait for the device, instead of the kernels that find each poisoned row and rewrite the output (one Triton kernel,
:mod:`.nan_kernel`, where it applies; seven otherwise; the 2026-11-27 figures below were measured against the seven). On an H200 the
look measured faster at every size tried, 12 to 768 MiB of bf16 q, k and v (at 768 MiB a causal call 3.02 ->
2.15 ms beside SDPA's 2.05 ms; benchmarks/results/gpu/2026-11-27/). From 32 MiB on, the kernels' own device time
(reading q, k and v, rewriting the output: tens of microseconds and more) is at least the idle gap a wait leaves,
so a program whose GPU, not its host, is the bottleneck should not lose either. Below it the look saves host time
where the host is the bottleneck (measured with 0: a tiny decoding call 102 -> 45 us, ``generate`` at batch 1
51 -> 65 tokens/s, at batch 16 the same within noise), but its wait can idle a busy GPU, which was not measured:
set 0 for host-bound work such as decoding at small batches, ``math.inf`` to keep every call free of waits. (Those
figures were taken against the seven kernels. Below the threshold the rule is now one Triton kernel where it applies
(:mod:`.nan_kernel`): 34.5-36.8 us for that tiny decoding call without a wait, so the advice to set 0 is unverified
since; benchmarks/results/gpu/2026-11-27_ninth/.)
Compiling, CUDA-graph capture and ``torch.cuda.set_sync_debug_mode`` never look."""


def looks_first(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether the rule settles the common case, no NaN at all, with a look on the host before it acts: always
    on the CPU, on CUDA for calls of at least :data:`DEVICE_LOOK_MIN_BYTES` of q, k and v outside CUDA-graph
    capture (where a wait is an error) and unless ``torch.cuda.set_sync_debug_mode`` hunts waits (the caller asked
    for none); never while compiling (a look is a graph break) or under a torch.func transform (under vmap there
    is no one value to look at: :mod:`.tracing`), nor on other devices."""
    if q.is_cpu:  # traced() inline: a Python frame fewer on every plain call
        return not torch.compiler.is_compiling() and not transformed()
    return (q.is_cuda and not traced() and q.nbytes + k.nbytes + v.nbytes >= DEVICE_LOOK_MIN_BYTES
            and not torch.cuda.is_current_stream_capturing()
            and torch.cuda.get_sync_debug_mode() == 0)


_SCANNED_UP_TO = {torch.float32: 4096, torch.bfloat16: 4096, torch.float64: 2048, torch.float16: 1024}
"""The most elements of a CPU tensor of each dtype that :func:`holds_nan` scans with ``x.equal(x)`` rather than
reduces with ``amax``: about where the two cost the same timed alone (PyTorch 2.13, AVX2:
benchmarks/results/overhead_ab_2026-11-27_eleventh/equal_sizes.txt). Inside a call the scan's lead over the
maximum is larger (1.0 us of a plain ``attention()`` call, 2.7-3.3 us of a masked MultiHeadAttention call, 4.4 us
of a transformers Llama layer's attention: equal_look_*.txt there), so the sizes lean towards it."""


def holds_nan(x: Tensor) -> bool:
    """Whether the non-empty tensor ``x`` holds a NaN, read on the host (on a device, a wait for it).

    A small CPU tensor is compared with itself: ``torch.equal(x, x)`` is False exactly where x holds a NaN
    (documented since PyTorch 2.1.1; its CPU kernel scans a tensor compared with itself for one), one dispatch that
    answers a Python bool, where a reduction builds a 0-dim tensor and ``item`` reads it in a second dispatch.
    A larger one, or one on a device, takes the vectorised maximum, which propagates NaN and never overflows
    (``amax``, not ``Tensor.max()``: max() is 0.2 us faster on a contiguous tensor but 1.3 us slower on the
    transposed output a layer's SDPA returns, benchmarks/results/overhead_ab_2026-11-27_fifth/look_layout.txt).
    Where the compiled module is built (:mod:`.compiled`), a CPU tensor's look is its ``holds_nan``: a scan of the
    elements' bits, 0.57 us for 4,096 float32 where their maximum takes 1.8 (plain.cpp; scan_sizes.txt in
    benchmarks/results/overhead_ab_2026-11-28_fifteenth/)."""
    if x.is_cpu:
        if _scan is not None:  # compiled: a scan of the elements' bits, or the maximum for large ones
            return _scan(x)
        if x.numel() <= _SCANNED_UP_TO.get(x.dtype, 0):
            return not x.equal(x)
    return math.isnan(x.amax().item())


def plain_output(q: Tensor, k: Tensor, v: Tensor, dims: Dims, output: Tensor, causal: bool) -> Tensor:
    """SDPA's ``output`` of a plain call (no mask, bias, window, score_mod or sinks) with the rule: where
    some query sees every key (not causal, or causal with L >= S) and there are at least
    :func:`plain_look_min_keys` of them (:data:`PLAIN_LOOK_MIN_KEYS` on CUDA), one look at the output settles the
    common case where the rule looks first (:func:`looks_first`; otherwise :func:`with_nan_rows`)."""
    if not _on:
        return output
    if q.is_cpu and not is_compiling():  # first: traced (compiled, exported) shapes may be symbols, and a test a guard
        if dims.Ev and dims.B and dims.H:  # an empty output has no maximum
            return cpu_plain_output(q, k, v, output, dims.L, dims.S, causal, dims)
    elif (looks_first(q, k, v) and (not causal or dims.L >= dims.S) and dims.Ev and dims.B and dims.H
            and dims.S >= PLAIN_LOOK_MIN_KEYS and not holds_nan(output)):
        return output
    return with_nan_rows(q, k, v, dims, output)


def cpu_plain_output(q: Tensor, k: Tensor, v: Tensor, output: Tensor, L: int, S: int, causal: bool,
                     dims: Dims | None) -> Tensor:
    """:func:`plain_output` on the CPU, uncompiled: SDPA's non-empty ``output`` of a plain call with ``L`` queries
    and ``S`` keys, and the call's ``dims`` (None: as many key as query heads, values as wide as the queries). One
    look where a query sees every key and there are :func:`plain_look_min_keys`, unless a torch.func transform is
    active; else the rows from q, k and v."""
    if not _on:
        return output
    if (not transformed() and (not causal or L >= S) and S >= _MIN_KEYS.get(output.dtype, PLAIN_LOOK_MIN_KEYS)
            and not holds_nan(output)):
        return output
    if dims is None:
        B, H, _, E = q.shape
        dims = Dims(B, H, H, L, S, E, E)
    return with_nan_rows(q, k, v, dims, output)


def masked_output(q: Tensor, k: Tensor, v: Tensor, dims: Dims, output: Tensor) -> Tensor:
    """SDPA's ``output``, as it returned it, of an uncompiled CPU call under a boolean mask and nothing else
    (``attention()``'s direct path: a mask, a window or a block mask as its dense mask, where SDPA zeroes a row with
    no allowed key itself and nothing is filled over it) with the rule. The caller settled that the rule may look
    (:func:`looks_first`: the CPU, not compiling). Where PyTorch's CPU kernels are known (AVX2 and AVX-512:
    :func:`plain_look_min_keys`), one look at the output settles the common case: there
    SDPA carries every NaN of q, k or v into a masked call's output at any length, a NaN in a key or value no
    query may attend, and a NaN query in a row with no allowed key, included (its masked scores are NaN + -inf;
    checked at every position, dtype and mask kind in tests/functional/test_per_call.py). The look is one
    reduction and a host read, where the inputs' maxima are three and three (2.4 us against 6.9 of a tiny
    call's 26.5: benchmarks/results/overhead_ab_2026-11-27_eighth/masked_pieces.txt). Elsewhere the rule reads q,
    k and v (:func:`applied`)."""
    if not _on:
        return output
    if _MIN_KEYS and dims.B and dims.H:  # an empty output has no maximum (and no row to poison)
        return with_nan_rows(q, k, v, dims, output) if holds_nan(output) else output
    return applied(q, k, v, dims, output, None, None, None)[0]


def with_nan_rows(q: Tensor, k: Tensor, v: Tensor, dims: Dims, output: Tensor) -> Tensor:
    """``output`` with the rows the NaN rule poisons set to NaN. A plain call where the rule looks first comes here
    only when its output shows a NaN: where some query sees every key (no mask; not causal, or causal with
    L >= S) and S >= plain_look_min_keys(dtype), SDPA's CPU kernels carry any NaN of q, k or v into the output
    (checked over dtypes, shapes and positions: tests/functional/test_per_call.py), and so do its CUDA kernels from
    PLAIN_LOOK_MIN_KEYS keys (tests/gpu/test_nan_rule_cuda.py), so that one look settles the common case."""
    if output.is_cuda and nan_kernel.poisoned_in_place(q, k, v, dims, output):  # one kernel for the seven below
        return output
    poisoned = poisoned_rows(q, k, v, dims)
    return output if poisoned is None else torch.where(poisoned, math.nan, output)


def applied(q: Tensor, k: Tensor, v: Tensor, dims: Dims, output: Tensor, lse: Tensor | None, weights: Tensor | None,
            heads: list[int] | None) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """``output`` (B, H, L, Ev), ``lse`` (B, H, L) and ``weights`` (of query ``heads``) with the rows the rule
    poisons set to NaN, when the rule is on: what :func:`attnkit.attention` and
    :func:`attnkit.functional.topk.topk_attention` do after any backend."""
    if not _on:
        return output, lse, weights
    if (lse is None and weights is None and output.is_cuda and not looks_first(q, k, v)
            and nan_kernel.poisoned_in_place(q, k, v, dims, output)):  # one kernel for the seven below
        return output, lse, weights
    poisoned = poisoned_rows(q, k, v, dims)
    if poisoned is None:
        return output, lse, weights
    output = torch.where(poisoned, math.nan, output)  # where(): one kernel (masked_fill is a copy and a fill)
    lse = None if lse is None else torch.where(poisoned[..., 0], math.nan, lse)
    if weights is not None:
        weights = torch.where(poisoned if heads == list(range(dims.H)) else poisoned[:, heads], math.nan, weights)
    return output, lse, weights


_MAXIMA = getattr(torch, "_foreach_max", None) or (lambda tensors: [x.amax() for x in tensors])
"""Whole-tensor maxima of a list of tensors: torch's foreach form where this PyTorch has it."""


def shared_base(q: Tensor, k: Tensor, v: Tensor) -> Tensor | None:
    """The tensor q, k and v are all views of, where it holds no more elements than they do together (a layer's
    packed projection (B, L, (H + 2 Hkv) E), split by heads), else None. No NaN in it means none in q, k or v,
    and one contiguous maximum reads it faster than three over strided views (a padded self-attention call of
    :class:`~attnkit.layers.MultiHeadAttention`: benchmarks/results/overhead_ab_2026-11-27_sixth/). Inference
    tensors keep no base (None: three maxima)."""
    base = q._base
    if (base is None or k._base is not base or v._base is not base or not base.numel()
            or base.numel() > q.numel() + k.numel() + v.numel()):
        return None
    return base


def poisoned_rows(q: Tensor, k: Tensor, v: Tensor, dims: Dims) -> Tensor | None:
    """(B, H, L, 1) True where NaN must propagate, or None when q, k and v hold no NaN.

    One rule for every backend (fused kernels differ: SDPA turns a NaN query into a zero output):
    a NaN in query row i makes row i NaN; a NaN anywhere in the keys or values of a (batch, key
    head) makes every row of the query heads that read it NaN, whatever the mask says."""
    if dims.E == 0:
        return None
    # A maximum propagates NaN and never overflows: one cheap pass each (isnan(x).any() builds a bool
    # copy of x and measured 5-20x slower, a decoding step 4x slower in all). The common case, no NaN
    # at all, is settled on the CPU by one look at the tensor q, k and v are views of (a layer's packed
    # projection: shared_base; holds_nan), else by three whole-tensor maxima in one foreach call (2.6 us for a tiny
    # call against 6.8 us as three amax, a reduce and an isnan; benchmarks/overhead.py), and a look.
    if looks_first(q, k, v):
        base = shared_base(q, k, v)  # (never empty)
        if base is not None:
            if not holds_nan(base):
                return None
        else:
            present = [x for x in (q, k, v) if x.numel()]
            if not present:
                return None
            maxima = _MAXIMA(present)  # one dispatch, then one to three floats (item: no grad warning), one copy off a GPU
            if not any(map(math.isnan, map(Tensor.item, maxima) if q.is_cpu else torch.stack(maxima).tolist())):
                return None
    q_max = q.amax(dim=-1, keepdim=True)  # (B, H, L, 1)
    kv_max = None  # torch.maximum propagates NaN: one (B, Hkv, 1, 1) maximum over the keys and the values
    for x in (k, v):
        if x.numel():
            m = x.amax(dim=(2, 3), keepdim=True)  # one stage: two (over E, then S) measured 2.2-2.6x slower on an H100
            kv_max = m if kv_max is None else torch.maximum(kv_max, m)
    if kv_max is None:
        return torch.isnan(q_max)
    # Query head h reads key head h // groups, and the groups are consecutive: the (B, Hkv) maxima repeated per query
    # head as keys are (a copy of B x H elements), then one more maximum is NaN exactly where the query row or its keys
    # and values hold a NaN. Nothing that carries L is viewed after a broadcast: under torch.export with a dynamic
    # length, torch 2.11 guards such a view's strides over Min(L, 2 L) and refuses the declared range (torch 2.13
    # does not; benchmarks/results/gpu/2026-11-28_thirteenth/export_diag/).
    kv_max = repeat_kv(kv_max, dims.groups)
    return torch.isnan(torch.maximum(q_max, kv_max))  # without a look first (no device sync) always: 6 or 7 small ops


def _compiled_scan():
    """The compiled module's holds_nan, with the thresholds it needs given to it (:mod:`.compiled`), or None."""
    if compiled.module is None:
        return None
    compiled.module.configure([plain_look_min_keys(dtype) for dtype in
                               (torch.float64, torch.float32, torch.bfloat16, torch.float16)])
    return compiled.holds_nan


_scan = _compiled_scan()
