"""The "tiled" backend: exact attention by online softmax over blocks (Milakov & Gimelshein 2018;
Dao et al. 2022, FlashAttention), in plain PyTorch.

Queries are taken in blocks; for each query block only the key range its structural mask allows
(causal, sliding window) is visited, in key blocks, keeping a running max ``m``, normaliser ``l``
and output accumulator:

    m' = max(m, rowmax(s));  p = exp(s - m');  l' = l e^(m - m') + rowsum(p);
    acc' = acc e^(m - m') + p V;  finally  out = acc / l,  lse = m + log l.

Memory is O(block_q x block_k) for scores plus O(L) for statistics: linear in sequence length.
The backward pass never stores weights: it recomputes each block's probabilities from the saved
row maximum and normaliser, p = exp((s - m) - log l), and uses D = rowsum(dO * O):

    dV += p^T dO;  dP = dO V^T;  dS = p (dP - D + dlse);  dQ += dS K scale;  dK += dS^T Q scale.

``m`` and ``log l`` are kept apart, not as their sum, the lse: a row whose scores are all huge (a bias
of -1e9 on every key, the ``masked_fill(~allowed, -1e9)`` convention) has m = -1e9, and m + log l
rounds to m in float32, which would make every p of the row 1 instead of 1/S. Scores that carry a
bias or a score_mod are computed in natural units and subtracted from their maximum before any
conversion, so that such a row rounds as the plain softmax rounds it.

The lse is differentiable too (d lse / d s = p), so that learned sinks, which rescale the output
by exp(lse - logaddexp(lse, sink)), train through this backend.

Key blocks that a user-supplied boolean mask rules out entirely are skipped as well. With a
:class:`~attnkit.functional.block_mask.BlockMask`, queries go in the mask's row blocks and only its
non-empty tiles are visited, in runs of one kind: full runs need no mask work, partial runs
evaluate the mask for that run only. A ``score_mod`` rewrites each block's scores; its
derivative comes from autograd on the block in the backward pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from ..precision import compute_dtype
from ..tracing import refuse_in_one_graph
from .common import BackendResult, Problem, group_heads, score_mod_needs_grad, slice_block

__all__ = ["forward", "BLOCK_Q", "MIN_BLOCK_K", "SCORE_BLOCK_ELEMENTS", "NO_SHIFT_BOUND"]

LOG2E = 1.4426950408889634
"""Scores of q and k alone are kept in log2 units (q pre-multiplied by scale x log2 e) because 2^x
is about twice as fast as e^x in PyTorch's CPU kernels; the log-sum-exp is returned in natural units.
Scores with a bias or a score_mod stay in natural units (a huge bias times log2 e would lose the
digits that tell its keys apart) and are converted after their row maximum is subtracted."""
NO_SHIFT_BOUND = 40.0
"""When every score of a query row is provably in [-40, 40] (|q_i . k_j| scale <=
||q_i|| max_j ||k_j|| scale, computed in O((L + S) E) on the device), e^s neither overflows nor underflows in
float32 (e^40 = 2.4e17, and a sum over 10^9 keys stays below 1e27), so the row needs no shift: p = e^s,
exactly as softmax without the shift. Each row is asked alone: a bounded row shifts by 0 and an unbounded one
(or any, with a bias) keeps the usual online max, so a row's numbers depend on its own example only. On the
CPU a block whose rows are all bounded skips the running max and its rescaling (the same numbers, 8-15% less
time); nothing is read on the host on other devices."""

BLOCK_Q = 256
"""Queries per block."""
MIN_BLOCK_K = 64
"""Fewest keys per block."""
SCORE_BLOCK_ELEMENTS = 1 << 20
"""Upper bound on B x H x block_q x block_k, the size of one score block (4 MiB in float32, so
that a block and its temporaries stay in a 32 MiB L3; measured best of 64..512 x 256K..4M
elements at n = 4K and 8K on 2 cores)."""


def _block_k(problem: Problem) -> int:
    dims = problem.dims
    per_key = dims.B * dims.H * min(BLOCK_Q, max(1, dims.L))
    return max(MIN_BLOCK_K, SCORE_BLOCK_ELEMENTS // max(1, per_key))


def _blocks(problem: Problem) -> Iterator[tuple[int, int, list[tuple[int, int, bool]]]]:
    """Yield (q0, q1, key blocks) for every query block with at least one key to visit; a key
    block is (k0, k1, partial): ``partial`` when the block mask must be evaluated there."""
    dims = problem.dims
    block_k = _block_k(problem)
    mask = problem.block_mask
    if mask is None:
        for q0 in range(0, dims.L, BLOCK_Q):
            q1 = min(dims.L, q0 + BLOCK_Q)
            lo, hi = problem.key_range(q0, q1)
            if hi > lo:
                yield q0, q1, [(k0, min(hi, k0 + block_k), False) for k0 in range(lo, hi, block_k)]
        return
    mask_q, mask_k = mask.block_size
    # block_k was sized for BLOCK_Q query rows; keep the score block's element count.
    width = max(1, block_k * BLOCK_Q // mask_q // mask_k)
    for row, runs in enumerate(mask.runs(width)):
        q0, q1 = row * mask_q, min(dims.L, (row + 1) * mask_q)
        lo, hi = problem.key_range(q0, q1)
        key_blocks = [(max(k0, lo), min(k1, hi), partial) for k0, k1, partial in runs if k0 < hi and k1 > lo]
        if key_blocks:
            yield q0, q1, key_blocks


class _Blocks:
    """Scores of one block with bias and masks applied, shared by forward, backward and dropout."""

    def __init__(self, problem: Problem, acc: torch.dtype, device: torch.device, seed: int | None):
        self.problem = problem
        self.acc = acc
        self.device = device
        self.seed = seed
        self.mask = group_heads(problem.mask, problem.dims)  # (B|1, Hkv|1, G|1, L|1, S)
        self.bias = group_heads(problem.bias, problem.dims)
        # Natural units where a bias or score_mod may make scores huge (module docstring), else log2.
        self.natural = problem.bias is not None or problem.score_mod is not None
        self.q_factor = problem.scale if self.natural else problem.scale * LOG2E  # q's multiplier
        self.to_log2 = LOG2E if self.natural else 1.0  # (s - m) times this is in log2 units
        self._structure: dict[tuple[int, int, int], Tensor | None] = {}

    def structure(self, q0: int, q1: int, k0: int, k1: int) -> Tensor | None:
        """The structural (causal / window) mask of a block as an additive tile, or None if it
        allows everything. A tile depends only on its shape and on q0 + offset - k0, so the
        diagonal tiles of a call are built once each."""
        key = (q1 - q0, k1 - k0, q0 + self.problem.offset - k0)
        if key not in self._structure:
            allowed = self.problem.structural_block(q0, q1, k0, k1, self.device)
            self._structure[key] = None if allowed is None else torch.zeros(
                allowed.shape, dtype=self.acc, device=self.device).masked_fill_(~allowed, float("-inf"))
        return self._structure[key]

    def scores(
        self,
        q_block: Tensor,
        k_t: Tensor,
        q0: int,
        q1: int,
        k0: int,
        k1: int,
        partial: bool = False,
        out: Tensor | None = None,
        modified: list | None = None,
    ) -> Tensor | None:
        """(B, Hkv, G, bq, bk) scores with -inf where masked, in log2 units (times log2 e) or, with a
        bias or score_mod, natural ones (``natural``); None if the block is fully masked.

        ``q_block`` is scaled by ``q_factor`` and ``k_t`` (B, Hkv, 1, E, S) already in the
        accumulation dtype. ``partial``: apply the block mask's tile. With a score_mod and a
        ``modified`` list, the block's (raw scores requiring grad, modified scores) are appended
        to it for the backward pass."""
        user = None if self.mask is None else slice_block(self.mask, q0, q1, k0, k1)
        if user is not None and not torch.compiler.is_compiling() and not bool(user.any()):
            return None  # (compiled: computed and masked whole, where asking would be a host read)
        if out is not None and out.shape[-2:] == (q1 - q0, k1 - k0):
            s = torch.matmul(q_block, k_t[..., k0:k1], out=out)  # reused buffer: no page faults per block
        else:
            s = q_block @ k_t[..., k0:k1]
        if self.bias is not None:
            s += slice_block(self.bias, q0, q1, k0, k1).to(self.acc)
        problem = self.problem
        if problem.score_mod is not None:  # natural units: the score_mod sees the scores as they are
            if modified is not None:
                with torch.enable_grad():
                    raw = s.detach().requires_grad_()
                    new = problem.modify_scores(raw.flatten(1, 2), q0, k0)
                modified.append((raw, new))
                s = new.detach().unflatten(1, raw.shape[1:3])
            else:
                s = problem.modify_scores(s.flatten(1, 2), q0, k0).unflatten(1, s.shape[1:3])
        if user is not None:
            s.masked_fill_(~user, float("-inf"))
        # Masks are added as -inf tiles (a tenth of masked_fill's time); with a bias or a score_mod, which
        # may put a NaN or an inf at a masked key (NaN + -inf and inf + -inf are NaN), they replace the
        # score instead: a masked key stays masked whatever was made of its score.
        structure = self.structure(q0, q1, k0, k1)
        if structure is not None:
            self._mask_with(s, structure)
        if partial:
            assert problem.block_mask is not None  # only a block mask has partial tiles
            self._mask_with(s, group_heads(problem.block_mask.additive(q0, q1, k0, k1, self.acc), problem.dims))
        return s

    def _mask_with(self, s: Tensor, additive: Tensor) -> None:
        if self.bias is None and self.problem.score_mod is None:
            s.add_(additive)
        else:
            s.masked_fill_(additive == float("-inf"), float("-inf"))

    def keep(self, shape: torch.Size, q0: int, k0: int) -> Tensor:
        """Dropout keep-mask scaled by 1/(1-p), identical in forward and backward for a block."""
        p = self.problem.dropout_p
        generator = torch.Generator(device=self.device)
        assert self.seed is not None  # dropout always has a seed
        generator.manual_seed(self.seed + q0 * (self.problem.dims.S + 1) + k0)
        uniform = torch.rand(shape, generator=generator, device=self.device, dtype=self.acc)
        return (uniform >= p).to(self.acc) / (1.0 - p)


class _Statistics(NamedTuple):
    """What the forward keeps per query row for the backward, (B, Hkv, G, L) each, in the accumulation
    dtype: the row maximum ``m`` of the scores in the blocks' units (0 where no maximum was kept, and
    for a row with no key) and log2 of the normaliser, log2 l (0 for a row with no key), so that the
    backward's p = 2^((s - m) to_log2 - log2 l) never adds a small log l to a huge m."""

    row_max: Tensor
    log2_sum: Tensor

    def lse(self, to_log2: float) -> Tensor:
        """The natural log-sum-exp, m + ln l, -inf for a row with no key (l = 0)."""
        return self.row_max / (LOG2E / to_log2) + self.log2_sum / LOG2E


def _forward(q: Tensor, k: Tensor, v: Tensor, problem: Problem, seed: int | None
             ) -> tuple[Tensor, Tensor, _Statistics]:
    dims = problem.dims
    acc = compute_dtype(q.dtype)
    blocks = _Blocks(problem, acc, q.device, seed)
    q_g = group_heads(q, dims)  # (B, Hkv, G, L, E)
    k_t = k.to(acc).transpose(-1, -2)[:, :, None]  # (B, Hkv, 1, E, S); half types converted once
    v_g = v.to(acc)[:, :, None]  # (B, Hkv, 1, S, Ev)
    # (B, Hkv, 1); a bias is unbounded. Compiled, no block is asked whether it is bounded (a host read: a graph break
    # per block, and torch.compile(fullgraph=True) refuses it): every block takes the shifted path, as exact.
    key_norm = None if blocks.natural or torch.compiler.is_compiling() else k_t.norm(dim=-2).amax(dim=-1)
    out = torch.zeros(dims.B, dims.Hkv, dims.groups, dims.L, dims.Ev, dtype=q.dtype, device=q.device)
    stats = _Statistics(row_max=torch.zeros(dims.B, dims.Hkv, dims.groups, dims.L, dtype=acc, device=q.device),
                        log2_sum=torch.full((dims.B, dims.Hkv, dims.groups, dims.L), float("-inf"), dtype=acc,
                                            device=q.device))
    to_log2 = blocks.to_log2
    score_buffer = product_buffer = None
    for q0, q1, key_blocks in _blocks(problem):
        q_block = q_g[..., q0:q1, :].to(acc) * blocks.q_factor  # (B, Hkv, G, bq, E), in the blocks' units
        if score_buffer is None or score_buffer.shape[-2] != q1 - q0:
            width = key_blocks[0][1] - key_blocks[0][0]
            score_buffer = torch.empty(*q_block.shape[:-1], width, dtype=acc, device=q.device)
            product_buffer = torch.empty(*q_block.shape[:-1], dims.Ev, dtype=acc, device=q.device)
        row_sum = torch.zeros(q_block.shape[:-1], dtype=acc, device=q.device)
        acc_out = torch.zeros(*q_block.shape[:-1], dims.Ev, dtype=acc, device=q.device)
        # Which rows' scores are bounded is asked of each row alone (its query's norm and its example's keys), so
        # that one example's numbers never depend on another's; only on the CPU, where it costs no device wait,
        # is it asked whether every row is, to take the path without a maximum.
        bounded_rows = None if key_norm is None else q_block.norm(dim=-1) * key_norm[..., None] <= NO_SHIFT_BOUND * LOG2E
        bounded = bounded_rows is not None and q.is_cpu and bool(bounded_rows.all())
        row_max = None if bounded else torch.full_like(row_sum, float("-inf"))
        for k0, k1, partial in key_blocks:
            s = blocks.scores(q_block, k_t, q0, q1, k0, k1, partial, out=score_buffer)
            if s is None:
                continue
            if bounded:  # |s| <= NO_SHIFT_BOUND: 2^s neither overflows nor underflows, no max needed
                p = s.exp2_()
                row_sum.add_(p.sum(dim=-1))
            else:
                assert row_max is not None  # set whenever the block is not bounded
                new_max = torch.maximum(row_max, s.amax(dim=-1))
                if bounded_rows is not None:  # a bounded row shifts by 0 throughout: the numbers of the path above
                    new_max = new_max.masked_fill(bounded_rows, 0.0)
                # Rows with nothing allowed yet keep max -inf; shift them by 0 so exp gives 0, not NaN.
                shift = new_max.masked_fill(torch.isinf(new_max), 0.0)
                s.sub_(shift[..., None])
                p = (s.mul_(to_log2) if to_log2 != 1.0 else s).exp2_()
                rescale = (row_max - shift).mul_(to_log2).exp2_()
                row_sum.mul_(rescale).add_(p.sum(dim=-1))
                acc_out.mul_(rescale[..., None])
                row_max = new_max
            if problem.dropout_p > 0:
                p = p * blocks.keep(p.shape, q0, k0)
            acc_out.add_(torch.matmul(p, v_g[..., k0:k1, :], out=product_buffer))
        empty = row_sum == 0
        out[..., q0:q1, :] = (acc_out / row_sum.masked_fill(empty, 1.0)[..., None]).to(q.dtype)
        stats.log2_sum[..., q0:q1] = row_sum.log2()
        if row_max is not None:
            stats.row_max[..., q0:q1] = row_max.masked_fill(torch.isinf(row_max), 0.0)
    lse = stats.lse(to_log2)
    return out.flatten(1, 2), lse.flatten(1, 2), stats


def _backward(
    q: Tensor, k: Tensor, v: Tensor, out: Tensor, stats: _Statistics, d_out: Tensor, d_lse: Tensor | None,
    problem: Problem, seed: int | None,
) -> tuple[Tensor, Tensor, Tensor]:
    dims = problem.dims
    acc = compute_dtype(q.dtype)
    blocks = _Blocks(problem, acc, q.device, seed)
    q_g = group_heads(q, dims)
    k_g = k.to(acc)[:, :, None]  # (B, Hkv, 1, S, E)
    k_t = k_g.transpose(-1, -2)  # (B, Hkv, 1, E, S)
    v_t = v.to(acc).transpose(-1, -2)[:, :, None]  # (B, Hkv, 1, Ev, S)
    d_out_g = group_heads(d_out, dims)
    row_max = stats.row_max
    log2_sum = stats.log2_sum.masked_fill(torch.isinf(stats.log2_sum), 0.0)  # fully masked rows: every p is 2^-inf = 0
    to_log2 = blocks.to_log2
    delta = (d_out_g.to(acc) * group_heads(out, dims).to(acc)).sum(dim=-1)  # D = rowsum(dO * O)
    if d_lse is not None:  # d lse / d s = p, so the lse's gradient enters as dS = p (dP - D + dlse)
        delta = delta - group_heads(d_lse, dims).to(acc).nan_to_num(0.0)
    d_q = torch.zeros(q_g.shape, dtype=acc, device=q.device)
    d_k = torch.zeros(k.shape, dtype=acc, device=q.device)
    d_v = torch.zeros(v.shape, dtype=acc, device=q.device)
    for q0, q1, key_blocks in _blocks(problem):
        q_raw = q_g[..., q0:q1, :].to(acc)
        q_block = q_raw * blocks.q_factor
        d_out_block = d_out_g[..., q0:q1, :].to(acc)
        max_block, log2_sum_block = row_max[..., q0:q1, None], log2_sum[..., q0:q1, None]
        delta_block = delta[..., q0:q1, None]
        for k0, k1, partial in key_blocks:
            modified: list[tuple[Tensor, Tensor]] | None = [] if problem.score_mod is not None else None
            s = blocks.scores(q_block, k_t, q0, q1, k0, k1, partial, modified=modified)
            if s is None:
                continue
            s.sub_(max_block)  # first the maximum, then the normaliser (_Statistics)
            p = (s.mul_(to_log2) if to_log2 != 1.0 else s).sub_(log2_sum_block).exp2_()  # (B, Hkv, G, bq, bk)
            d_p = d_out_block @ v_t[..., k0:k1]
            if problem.dropout_p > 0:
                keep = blocks.keep(p.shape, q0, k0)
                d_v[:, :, k0:k1] += torch.einsum("bhgqk,bhgqe->bhke", p * keep, d_out_block)
                d_p *= keep
            else:
                d_v[:, :, k0:k1] += torch.einsum("bhgqk,bhgqe->bhke", p, d_out_block)
            d_s = p.mul_(d_p.sub_(delta_block))
            if modified:  # chain through score_mod: d raw = (d modified / d raw)^T d_s
                raw, new = modified[0]
                (d_raw,) = torch.autograd.grad(new, raw, d_s.flatten(1, 2))
                # none at a masked key (d_s = 0 there), whatever the score_mod made of a NaN there (0 x NaN)
                d_s = torch.where(d_s == 0, 0.0, d_raw)
            d_q[..., q0:q1, :] += d_s @ k_g[..., k0:k1, :]
            d_k[:, :, k0:k1] += torch.einsum("bhgqk,bhgqe->bhke", d_s, q_raw)
    d_q = (d_q * problem.scale).flatten(1, 2)
    d_k *= problem.scale
    return d_q.to(q.dtype), d_k.to(k.dtype), d_v.to(v.dtype)


class _TiledAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, problem, seed):
        out, lse, stats = _forward(q, k, v, problem, seed)
        ctx.save_for_backward(q, k, v, out, *stats)
        ctx.problem = problem
        ctx.seed = seed
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, d_out, d_lse):
        q, k, v, out, row_max, log2_sum = ctx.saved_tensors
        if d_out is None:
            d_out = torch.zeros_like(out)
        d_q, d_k, d_v = _backward(q, k, v, out, _Statistics(row_max, log2_sum), d_out, d_lse, ctx.problem, ctx.seed)
        return d_q, d_k, d_v, None, None


def forward(q: Tensor, k: Tensor, v: Tensor, problem: Problem) -> BackendResult:
    if problem.bias is not None and problem.bias.requires_grad:
        raise ValueError(
            "the tiled backend does not propagate gradients to bias; use backend='reference' "
            "or 'sdpa' for a learned bias"
        )
    if problem.score_mod is not None and torch.is_grad_enabled() and score_mod_needs_grad(problem.score_mod, q.device):
        raise ValueError(
            "score_mod reads tensors that require gradients; the tiled backend propagates gradients "
            "to q, k and v only: use backend='reference' for a learned score_mod"
        )
    refuse_in_one_graph("tiled", transformed_because="its loop looks at its tiles on the host and its "
                        "autograd.Function has no functorch rule",
                        exported_because="its loop looks at its tiles on the host, which an exported graph cannot")
    seed = None
    if problem.dropout_p > 0:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out, lse = _TiledAttention.apply(q, k, v, problem, seed)
    else:
        out, lse, _ = _forward(q, k, v, problem, seed)
    return BackendResult(output=out, lse=lse)
