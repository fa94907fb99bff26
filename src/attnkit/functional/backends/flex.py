"""The "flex" backend: PyTorch's FlexAttention (Dong et al. 2024) with attnkit's semantics.

FlexAttention compiles one fused kernel per mask and score pattern and skips the tiles a block mask
rules out. attnkit hands it one call's whole problem:

- **one block mask from attnkit's tile tables.** The call's parts (the structural mask: causal with
  its alignment or a sliding window; a boolean ``mask``; a :class:`~attnkit.masks.BlockMask`) each
  give EMPTY / PARTIAL / FULL per 128 x 128 tile, in closed form for the structure
  (:func:`~attnkit.functional.block_patterns.band_kinds`) and from the block mask's own table, and
  are combined tile by tile (empty if any part is, full if all are). The tables are written straight
  into torch's format; no mask function is evaluated to build them and no L x S tensor exists. One
  ``mask_mod`` ANDs the parts for the partial tiles.
- **one score_mod**: ``bias`` (looked up per score) then the call's ``score_mod``, in FlexAttention's
  semantics, which are attnkit's.
- **the log-sum-exp** comes back with the output; :func:`attnkit.attention` folds learned sinks into
  it and recomputes exact weights from it.

Compiling: one ``torch.compile(flex_attention)`` serves every call. Every number that varies
between calls of one pattern (lengths, offsets, the window) reaches the kernel as a tensor, so it
never triggers a recompile; the lengths are padded up to a bucket (powers of two to 512, then four
steps per octave) and the padding masked, so a training loop with varying lengths compiles once per
(bucket, dtype, head layout, pattern kind). Past ``RECOMPILE_LIMIT`` compiles the call fails loudly
instead of falling back to an unfused loop.

On the CPU, PyTorch compiles FlexAttention's forward only, for inference and without the lse:
attnkit runs that where it can (``COMPILE_ON_CPU``) and otherwise flex's unfused eager
implementation (with sinks; it materialises the L x S scores). Training through flex needs CUDA: a
CPU call that needs gradients is refused.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import warnings
from functools import cache

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import nan
from ..block_mask import length_bucket
from ..precision import compute_dtype
from ..tracing import refuse_in_one_graph
from . import flex_tables, reference
from .common import BackendResult, Problem, lse_unresolved, needs_grad, score_mod_needs_grad
from .flex_tables import BLOCK

__all__ = ["forward", "FlexUnavailable", "FlexRecompileLimit", "available", "flex_block_mask", "BLOCK",
           "COMPILE_ON_CPU", "CPU_COMPILED_DTYPES", "RECOMPILE_LIMIT"]

COMPILE_ON_CPU = True
"""Run the compiled CPU forward where PyTorch has one (no gradients, no lse); False: always flex's
eager implementation on the CPU (tests of the semantics compile nothing)."""
CPU_COMPILED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
"""The dtypes PyTorch's compiled CPU FlexAttention takes; float64 runs flex's eager implementation."""
RECOMPILE_LIMIT = 64
"""Compiles allowed for the flex call (PyTorch's default is 8, after which it silently runs an
unfused eager loop); beyond it attnkit raises :class:`FlexRecompileLimit` instead."""


class FlexUnavailable(RuntimeError):
    """This PyTorch has no usable FlexAttention (torch >= 2.6 with ``BlockMask(seq_lengths=...)``)."""


class FlexRecompileLimit(RuntimeError):
    """The compiled flex call met torch's recompile limit: more distinct patterns than it may compile."""


def available() -> bool:
    """Whether this PyTorch's FlexAttention can run attnkit's calls."""
    try:
        _flex()
    except FlexUnavailable:
        return False
    return True


@cache
def _flex():
    try:
        from torch.nn.attention import flex_attention as module
    except ImportError as error:  # pragma: no cover - every supported torch has it
        raise FlexUnavailable(f"this PyTorch ({torch.__version__}) has no FlexAttention: {error}") from error
    parameters = inspect.signature(module.BlockMask.__init__).parameters
    if "seq_lengths" not in parameters:
        raise FlexUnavailable(f"FlexAttention in PyTorch {torch.__version__} is too old for attnkit (needs 2.6+)")
    lse = ({"return_aux": module.AuxRequest(lse=True)} if hasattr(module, "AuxRequest")
           else {"return_lse": True})
    return module, lse


@cache
def _compiled():
    module, _ = _flex()
    return torch.compile(module.flex_attention, dynamic=False)


def flex_block_mask(kinds: Tensor, seq_lengths: tuple[int, int], mask_mod):
    """A ``torch.nn.attention.flex_attention.BlockMask`` from attnkit kinds (B|1, H|1, nQ, nK) on
    BLOCK x BLOCK tiles (:func:`.flex_tables.tables`), with ``mask_mod`` for the partial tiles."""
    module, _ = _flex()
    return module.BlockMask(seq_lengths=seq_lengths, **flex_tables.tables(kinds, seq_lengths), BLOCK_SIZE=(BLOCK, BLOCK),
                            mask_mod=mask_mod)


# ------------------------------------------------------------------------ mask_mod and score_mod
def _scalar(value: int, device) -> Tensor:
    """A 0-d int32 tensor: a value the compiled kernel reads instead of baking in (no recompile)."""
    return torch.full((), value, dtype=torch.int32, device=device)


def _lookup(table: Tensor):
    """Index a (B|1, H|1, L|1, S) tensor with flex's scalar indices, broadcasting its size-1 dims."""
    one_b, one_h, one_q = (table.shape[i] == 1 for i in range(3))

    def at(b, h, q_idx, kv_idx):
        return table[0 if one_b else b, 0 if one_h else h, 0 if one_q else q_idx, kv_idx]

    return at


def _as_4d(x: Tensor) -> Tensor:
    return x[None, None] if x.dim() == 2 else x


class _Call:
    """The mask_mod and score_mod of one call, with query and key indices clamped into [0, L) and
    [0, S) before any user function or table sees them (padded rows and keys are masked anyway)."""

    def __init__(self, problem: Problem, padded: bool, device):
        dims = problem.dims
        self.padded = padded
        self.last_q, self.last_k = _scalar(max(0, dims.L - 1), device), _scalar(max(0, dims.S - 1), device)
        self.keys = _scalar(dims.S, device)
        self.structured = problem.structured
        self.offset = _scalar(problem.offset, device)
        self.window = None if problem.window is None else _scalar(problem.window, device)
        self.mask = None if problem.mask is None else _lookup(_as_4d(problem.mask))
        block_mask = problem.block_mask
        self.block_dense = None
        self.block_mod = None
        if block_mask is not None:
            if block_mask._dense is not None:
                self.block_dense = _lookup(block_mask._dense)
            else:
                self.block_mod = block_mask.mask_mod
        acc = compute_dtype(problem.bias.dtype) if problem.bias is not None else None
        self.bias = None if problem.bias is None else _lookup(_as_4d(problem.bias).to(acc))
        self.user_score_mod = problem.score_mod

    def _clamped(self, q_idx, kv_idx):
        if not self.padded:
            return q_idx, kv_idx
        return torch.minimum(q_idx, self.last_q), torch.minimum(kv_idx, self.last_k)

    def mask_mod(self, b, h, q_idx, kv_idx):
        allowed = kv_idx < self.keys
        if self.structured:
            distance = kv_idx - q_idx
            allowed = allowed & (distance <= self.offset)
            if self.window is not None:
                allowed = allowed & (distance > self.offset - self.window)
        q_c, kv_c = self._clamped(q_idx, kv_idx)
        if self.mask is not None:
            allowed = allowed & self.mask(b, h, q_c, kv_c)
        if self.block_dense is not None:
            allowed = allowed & self.block_dense(b, h, q_c, kv_c)
        if self.block_mod is not None:
            allowed = allowed & self.block_mod(b, h, q_c, kv_c)
        return allowed

    def score_mod(self, score, b, h, q_idx, kv_idx):
        q_c, kv_c = self._clamped(q_idx, kv_idx)
        if self.bias is not None:
            score = score + self.bias(b, h, q_c, kv_c)
        if self.user_score_mod is not None:
            score = self.user_score_mod(score, b, h, q_c, kv_c)
        return score


# ------------------------------------------------------------------------------------- the call
@contextlib.contextmanager
def _loud_recompiles():
    """Raise past RECOMPILE_LIMIT compiles instead of PyTorch's silent switch to eager. The two
    settings are set and restored directly: ``config.patch`` built a class on every call."""
    config = torch._dynamo.config
    wanted = (("recompile_limit", max(RECOMPILE_LIMIT, getattr(config, "recompile_limit", 0))),  # never lower a user's
              ("fail_on_recompile_limit_hit", True))
    saved = {name: getattr(config, name) for name, _ in wanted if hasattr(config, name)}
    try:
        for name, value in wanted:
            if name in saved:
                setattr(config, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


SMALL_TILES = {"fwd_BLOCK_M": 64, "fwd_BLOCK_N": 64, "fwd_num_stages": 1,
               "bwd_BLOCK_M1": 32, "bwd_BLOCK_N1": 64, "bwd_BLOCK_M2": 64, "bwd_BLOCK_N2": 32, "bwd_num_stages": 1}
"""FlexAttention's ``kernel_options`` for the patterns whose default tiles need more shared memory
than the GPU has (Triton's "out of resource: shared memory", seen on an H100 with a bias tensor in
bf16 and fp16): smaller tiles, one pipeline stage, forward and backward."""
MAIN_KERNEL = {"FORCE_USE_FLEX_ATTENTION": True}
"""``kernel_options`` for short query blocks (under 128 queries, where FlexAttention takes its decoding
kernel) whose shape that kernel has no configuration for (inductor's "NoValidChoicesError", seen on an
H100 with torch 2.11 in float32, 64 queries of 8 heads over 2 key heads of 32): the main kernel, the
same arithmetic."""
_fallbacks: dict[tuple, dict] = {}


def fallback_for(error: Exception, queries: int) -> dict | None:
    """The ``kernel_options`` that compile a pattern whose default kernel failed with ``error``, or None
    where no other kernel would help (the error then propagates)."""
    text = str(error)
    if "out of resource" in text:
        return SMALL_TILES
    if "NoValidChoicesError" in text and queries < 128:
        return MAIN_KERNEL
    return None


def _run_compiled(q: Tensor, k: Tensor, v: Tensor, options: dict):
    """The compiled flex call. A pattern whose default kernel does not compile for this GPU compiles again
    with other ``kernel_options`` (:func:`fallback_for`: smaller tiles, or the main kernel instead of the
    decoding one; the same arithmetic), once per (device, dtype, head sizes, score_mod or not, short query
    block or not); any other compile error propagates."""
    key = (q.device, q.dtype, q.shape[-1], v.shape[-1], options["score_mod"] is not None, q.shape[-2] < 128)
    if key in _fallbacks:
        options = {**options, "kernel_options": _fallbacks[key]}
    with _loud_recompiles():
        try:
            try:
                return _compiled()(q, k, v, **options)
            except Exception as error:  # InductorError wraps Triton's OutOfResources and inductor's lowering errors
                chosen = fallback_for(error, q.shape[-2])
                if chosen is None or "kernel_options" in options:
                    raise
                _fallbacks[key] = chosen
                return _compiled()(q, k, v, **options, kernel_options=chosen)
        except torch._dynamo.exc.FailOnRecompileLimitHit as error:
            limit = torch._dynamo.config.recompile_limit
            raise FlexRecompileLimit(
                f"backend='flex' has compiled its kernel {limit} times in this process, torch's recompile limit: "
                "each new (length bucket, dtype, head layout, mask kind, score_mod) compiles once. Reuse fewer "
                "patterns, raise torch._dynamo.config.recompile_limit, or use backend='sdpa' or 'tiled' "
                "(docs/api.md, 'flex')") from error


def forward(q: Tensor, k: Tensor, v: Tensor, problem: Problem) -> BackendResult:
    dims = problem.dims
    refuse_in_one_graph("flex", transformed_because="PyTorch traces flex_attention with TorchDynamo, which does not "
                        "take the transform's tensors",
                        exported_because="it pads each call to a length bucket and keeps its compiled kernels and "
                        "tile tables between calls, which an exported graph cannot")
    if problem.dropout_p > 0:
        raise ValueError("the flex backend has no attention dropout (FlexAttention has none); "
                         "use backend='sdpa' or 'tiled' with dropout_p > 0")
    module, lse_request = _flex()
    on_cpu = q.is_cpu
    if on_cpu and needs_grad(q, k, v, problem):
        raise ValueError(
            "backend='flex' computes no gradients on the CPU (PyTorch's FlexAttention has no CPU backward): "
            "train with backend='tiled' or 'auto' on the CPU, or run on CUDA"
        )
    if on_cpu and problem.score_mod is not None and torch.is_grad_enabled() and score_mod_needs_grad(
            problem.score_mod, q.device):
        raise ValueError(
            "score_mod reads tensors that require gradients, and backend='flex' computes no gradients on the CPU: "
            "use backend='reference' (or 'auto') for a learned score_mod, or call under torch.no_grad()")
    if on_cpu:  # no gradient is needed; flex refuses CPU inputs that merely require one
        q, k, v = q.detach(), k.detach(), v.detach()
    elif problem.bias is not None and needs_grad(q, k, v, problem) and lse_unresolved(problem, q.device):
        return reference.forward(q, k, v, problem)  # flex's backward would misread the row (as sdpa's would)
    compiled = not on_cpu or (COMPILE_ON_CPU and problem.sinks is None and q.dtype in CPU_COMPILED_DTYPES)
    want_lse = not on_cpu or not compiled  # the CPU-compiled kernel returns no lse
    L, S = dims.L, dims.S
    Lp, Sp = (length_bucket(L), length_bucket(S)) if compiled else (L, S)

    def build() -> dict[str, Tensor]:
        return flex_tables.tables(flex_tables.call_kinds(problem, L, S, Lp, Sp, q.device), (Lp, Sp))

    def prepare() -> tuple[_Call, object]:
        # Compiled calls always clamp the indices, padded or not, so that a bucket's exact length
        # shares its graph with the lengths padded up to it.
        call = _Call(problem, padded=compiled or (Lp, Sp) != (L, S), device=q.device)
        if problem.mask is None:  # the tables depend on these numbers only
            tables = flex_tables.cached(problem, ("tables", q.device, L, S, Lp, Sp, problem.structured, problem.offset,
                                              problem.window), build)
        else:
            tables = build()
        return call, module.BlockMask(seq_lengths=(Lp, Sp), **tables, BLOCK_SIZE=(BLOCK, BLOCK), mask_mod=call.mask_mod)

    if problem.mask is None and problem.bias is None:  # the call's scalars and torch BlockMask: once per pattern
        call, block_mask = flex_tables.cached(problem, ("call", q.device, L, S, Lp, Sp, problem.structured, problem.offset,
                                                    problem.window, problem.score_mod, compiled), prepare)
    else:  # a per-call tensor (mask, bias) is read by the mask_mod or score_mod: prepared per call
        call, block_mask = prepare()
    if (Lp, Sp) != (L, S):
        q = F.pad(q, (0, 0, 0, Lp - L))
        k, v = F.pad(k, (0, 0, 0, Sp - S)), F.pad(v, (0, 0, 0, Sp - S))
    score_mod = call.score_mod if (problem.bias is not None or problem.score_mod is not None) else None
    options = dict(score_mod=score_mod, block_mask=block_mask, scale=problem.scale, enable_gqa=dims.H != dims.Hkv)
    if want_lse:
        options.update(lse_request)
    if compiled:
        result = _run_compiled(q, k, v, options)
    else:
        with warnings.catch_warnings():  # the eager path is chosen, not stumbled into
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            warnings.filterwarnings("ignore", message="return_lse is deprecated")
            result = module.flex_attention(q, k, v, **options)
    if want_lse:
        out, aux = result
        lse = aux.lse if hasattr(aux, "lse") else aux
        lse = lse[:, :, :L]
    else:
        out, lse = result, None
    out = out[:, :, :L]
    if problem.bias is not None and nan.on():  # FlexAttention's kernels drop a NaN score; the NaN rule keeps it
        out, lse = _nan_bias_rows(out, lse, problem)
    return BackendResult(output=out, lse=lse)


def _nan_bias_rows(out: Tensor, lse: Tensor | None, problem: Problem) -> tuple[Tensor, Tensor | None]:
    """With the NaN rule on: a NaN in ``bias`` at an allowed key makes its row NaN (at a masked key it changes
    nothing), as in every other backend. The mask is materialised (the bias already is) and the rows filled
    without a look."""
    assert problem.bias is not None  # called for calls with a bias only
    nan_keys = torch.isnan(problem.bias)
    allowed = problem.dense_mask(out.device)
    rows = (nan_keys if allowed is None else nan_keys & allowed).any(dim=-1)  # (L,) or (B|1, H|1, L|1)
    out = torch.where(rows[..., None], math.nan, out)
    return out, None if lse is None else torch.where(rows, math.nan, lse)
