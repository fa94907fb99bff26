"""Which backend ``backend="auto"`` runs for a call: the measured rules, one place.

On CUDA PyTorch's fused kernels only (SDPA, compiled FlexAttention), never the plain-PyTorch tiled loop;
on the CPU SDPA, or the tiled loop where block skipping or a learned sink's log-sum-exp wins. The thresholds
are measurements (each constant's docstring names its benchmark). :func:`attnkit.attention` asks
:func:`choose_backend` (and :func:`lse_backend` where the call needs the log-sum-exp).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from .backends import flex
from .backends.common import Problem, score_mod_needs_grad
from .block_mask import BlockMask

__all__ = ["choose_backend", "lse_backend", "classified", "AUTO_TILED_MIN_KEYS_PER_WINDOW", "AUTO_TILED_MAX_OCCUPANCY",
           "AUTO_CLASSIFY_MIN_ENTRIES", "AUTO_SINKS_SDPA_MAX_ENTRIES", "AUTO_SCORE_MOD_REFERENCE_MAX_ENTRIES",
           "AUTO_FLEX_MIN_ENTRIES"]

AUTO_TILED_MIN_KEYS_PER_WINDOW = 8
"""``auto`` takes the tiled backend for a sliding window once S >= this many windows; below
that, the fraction of blocks it can skip is too small to beat SDPA with a materialised mask
(benchmarks/attention.py, window 256 on 2 cores: tiled loses at S = 1K, wins from S = 2K)."""


AUTO_TILED_MAX_OCCUPANCY = 0.6
"""``auto`` takes the tiled backend for a block mask (or a boolean mask it has classified) whose
non-empty tiles are at most this fraction of all tiles: the tiled backend's dense speed is about
0.75-0.8x SDPA's on 2 cores, so below 0.6 it wins (BigBird at 2K, occupancy 0.56: tiled 1.08x
SDPA with the boolean mask; benchmarks/sparse.py)."""
AUTO_CLASSIFY_MIN_ENTRIES = 1 << 22
"""``auto`` classifies a plain boolean (L, S) mask into tiles only from L x S >= 4M entries (2K x
2K): below that SDPA's dense time is a few milliseconds and the skipping cannot pay."""


AUTO_SINKS_SDPA_MAX_ENTRIES = 1 << 16
"""On the CPU, learned sinks up to L x S = 64K scores (256 x 256) go to SDPA with the sink as one more
key (its mask materialised), above to the tiled loop: SDPA 30.6 / 66.4 / 502 us against tiled 90.1 /
126.8 / 519.5 us at L = S = 16 / 64 / 256 (H 4, E 32, one thread), tiled ahead from 512."""
AUTO_SCORE_MOD_REFERENCE_MAX_ENTRIES = 1 << 12
"""On the CPU, a score_mod call of up to L x S = 4K scores (64 x 64) goes to the reference backend's written-out
softmax, above to the tiled loop: reference 219 / 510 / 857 us against tiled 297 / 637 / 873 us at L = S = 16 / 32 /
64, tiled ahead from 128 (1,180 against 1,708 us; H 4, E 32, one thread, tanh softcapping;
benchmarks/score_mod_routing.py, benchmarks/results/score_mod_routing.json)."""
AUTO_FLEX_MIN_ENTRIES = 1 << 22
"""On CUDA, windows, block masks, sinks and bottom-right causal calls with L != S (KV-cache
prefills) go to flex from L x S >= 4M scores (2K x 2K); below that SDPA with the materialised mask
is cheap, and decoding steps (L = 1) stay on SDPA's kernels. A score_mod always goes to flex."""


def choose_backend(problem: Problem) -> str:
    """The backend ``"auto"`` runs: :func:`_choose_on_cuda` on CUDA, else the CPU rules:

    - a ``score_mod``: tiled, or reference up to AUTO_SCORE_MOD_REFERENCE_MAX_ENTRIES scores (and wherever it
      reads tensors that need gradients);
    - learned ``sinks``: SDPA up to AUTO_SINKS_SDPA_MAX_ENTRIES scores, else tiled (its lse carries
      them without materialising a mask);
    - a block mask with at most AUTO_TILED_MAX_OCCUPANCY of its tiles non-empty: tiled (not while compiling: the
      occupancy and the tiled loop's walk over the tiles read the mask on the host, a graph break each);
    - a sliding window long enough that block skipping wins (S >= AUTO_TILED_MIN_KEYS_PER_WINDOW
      x window): tiled;
    - otherwise SDPA (block masks and windows materialised).
    A bias that needs gradients always goes to SDPA (or reference with a score_mod).
    """
    if problem.device_type == "cuda" and flex.available():
        return _choose_on_cuda(problem)
    learned_bias = problem.bias is not None and problem.bias.requires_grad
    if problem.score_mod is not None:
        if learned_bias or problem.dims.L * problem.dims.S <= AUTO_SCORE_MOD_REFERENCE_MAX_ENTRIES or (
                torch.is_grad_enabled() and score_mod_needs_grad(problem.score_mod, problem.device)):
            return "reference"
        return "tiled"
    if learned_bias:
        return "sdpa"
    if problem.sinks is not None:
        return "sdpa" if problem.dims.L * problem.dims.S <= AUTO_SINKS_SDPA_MAX_ENTRIES else "tiled"
    if (problem.block_mask is not None and not torch.compiler.is_compiling()  # (its occupancy: a host read)
            and problem.block_mask.occupancy() <= AUTO_TILED_MAX_OCCUPANCY):
        return "tiled"
    window = problem.window
    if window is not None and problem.dims.S >= AUTO_TILED_MIN_KEYS_PER_WINDOW * window:
        return "tiled"
    return "sdpa"


def _choose_on_cuda(problem: Problem) -> str:
    """``auto`` on CUDA: PyTorch's fused kernels only, never the plain-PyTorch tiled loop.

    - dense, causal (top-left), padding or any boolean mask, bias, dropout: SDPA's fused kernels
      (flash / memory-efficient; a mask or bias goes as SDPA's ``attn_mask``);
    - score_mods; and from AUTO_FLEX_MIN_ENTRIES scores, sliding windows, block masks, learned
      sinks and bottom-right causal prefills: flex (compiled FlexAttention, empty tiles skipped);
      smaller ones SDPA with the mask materialised;
    - float64, dropout, a learned bias, a score_mod reading tensors that need gradients, or head
      dims that are not powers of two of at least 16 (what FlexAttention's kernels are sure to take):
      what handles them exactly (SDPA with the mask materialised, or reference for a score_mod).
    """
    learned_bias = problem.bias is not None and problem.bias.requires_grad
    dims = problem.dims
    odd_heads = not (_flex_takes_head_dim(dims.E) and _flex_takes_head_dim(dims.Ev))
    exact_only = problem.dtype == torch.float64 or problem.dropout_p > 0 or learned_bias or odd_heads
    if problem.score_mod is not None:
        needs_grad = torch.is_grad_enabled() and score_mod_needs_grad(problem.score_mod, problem.device)
        return "reference" if exact_only or needs_grad else "flex"
    if exact_only or dims.L * dims.S < AUTO_FLEX_MIN_ENTRIES:
        return "sdpa"  # small calls (decoding steps among them): the materialised mask is cheap
    bottom_right = problem.is_causal and problem.causal_align == "bottom-right" and dims.L != dims.S
    if problem.sinks is not None or problem.block_mask is not None or problem.window is not None or bottom_right:
        return "flex"
    return "sdpa"


def _flex_takes_head_dim(d: int) -> bool:
    """Whether FlexAttention's kernels are sure to take head dim ``d``: a power of two of at least 16."""
    return d >= 16 and d & (d - 1) == 0


def lse_backend(q: Tensor, dropout_p: float = 0.0) -> str:
    """The backend for a call that needs the log-sum-exp (merging partial attentions, learned sinks),
    in memory linear in the length: flex on CUDA where FlexAttention's kernels take the call exactly
    (half or float32, power-of-two head dims of at least 16, no dropout), else tiled."""
    E = q.shape[-1]
    flex_fits = (q.is_cuda and flex.available() and q.dtype != torch.float64 and dropout_p == 0
                 and _flex_takes_head_dim(E))
    return "flex" if flex_fits else "tiled"


def classified(problem: Problem) -> Problem:
    """For ``auto``: a large boolean mask with a real query dim becomes a block mask when few of
    its tiles hold anything (one pass over the mask), so that the tiled backend can skip the rest."""
    mask = problem.mask
    if mask is None or torch.compiler.is_compiling():  # (classifying reads the mask on the host: a graph break)
        return problem
    if mask.shape[-2] == 1 or problem.dims.L * problem.dims.S < AUTO_CLASSIFY_MIN_ENTRIES:
        return problem
    if problem.block_mask is not None:  # a block mask already describes the tiles
        return problem
    if problem.device_type == "cuda":  # SDPA takes the mask as it is; classifying would sync
        return problem
    if problem.bias is not None and problem.bias.requires_grad:
        return problem
    blocks = BlockMask.from_dense(mask if mask.dim() == 4 else mask[None, None])
    if blocks.occupancy() > AUTO_TILED_MAX_OCCUPANCY:
        return problem
    return dataclasses.replace(problem, mask=None, block_mask=blocks)
