r"""The delta rule and its gates: linear attention as a running regression.

The Linear Transformer keeps a running sum, S_t = S_{t-1} + k_t v_t^T. The delta rule (Schlag et al. 2021;
Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule") writes instead what the state
got wrong: it reads the value the state predicts for k_t, S_{t-1}^T k_t, and moves it towards v_t by a step
beta_t, one step of online regression. Gated DeltaNet (Yang, Kautz and Hatamizadeh, ICLR 2025) decays the
state first by a_t = exp(g_t); Kimi Delta Attention (Kimi Linear, 2025) decays each key channel by its own
rate. With a_t = exp(g_t), g_t <= 0 (a scalar per head, or a vector over the K key channels):

    S_t = diag(a_t) S_{t-1} + beta_t k_t (v_t - (diag(a_t) S_{t-1})^T k_t)^T,     o_t = S_t^T (scale q_t)

Without the delta term (S_t = diag(a_t) S_{t-1} + k_t v_t^T) it is gated linear attention; with a constant
per-head decay, lightning attention (MiniMax-01); with neither, the Linear Transformer's running sum.

Two exact ways to compute it, the same numbers (float64: 1e-10 apart):

- ``chunk_size=1``: the recurrence, token by token (the readable reference: :func:`_recurrent`);
- larger chunks: the chunked (WY / UT-transform) form. Inside a chunk of C tokens, with gamma_i the decay's
  running log-sum from the chunk's start, the new values u = beta (v - predicted) solve a unit lower
  triangular system, (I + A) u = beta v - beta (k exp(gamma)) S_0 with A_ij = beta_i sum_c k_ic k_jc
  exp(gamma_ic - gamma_jc) for i > j; the chunk's outputs and final state follow from u and S_0 by matrix
  products. Only the state S_0 passes from chunk to chunk; everything inside a chunk is batched over every
  chunk at once, and every exponent is of a difference gamma_i - gamma_j <= 0 (nothing overflows).

Layout (B, H, L, K) like every attnkit function: q, k (B, Hk, L, K), v (B, H, L, V), g (B, H, L) or
(B, H, L, K), beta (B, H, L); H a multiple of Hk (Qwen3-Next's 32 value heads on 16 key heads: each key head
serves H / Hk consecutive value heads). The state (B, H, K, V) is float32 (float64 for float64 inputs), as the
models keep it; outputs come back in the inputs' dtype.

Every one of these mechanisms computes out = A V for a lower-triangular L x L matrix A of q, k, g and beta
only: :func:`implicit_attention` returns it, so that attnkit's heatmaps, head roles and rollout read a linear
layer as they read a softmax one.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..precision import accumulation_dtype
from ..tracing import exportable
from .kernels import fla_linear, uses_fla

__all__ = ["LinearAttentionOutput", "gated_delta_rule", "delta_rule", "gated_linear_attention", "implicit_attention",
           "l2norm"]


@exportable
class LinearAttentionOutput(NamedTuple):
    """``output`` (B, H, L, V) in the inputs' dtype; ``final_state`` (B, H, K, V) in float32 (float64 for
    float64 inputs) when asked for, else None."""

    output: Tensor
    final_state: Tensor | None


def l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    """x / sqrt(sum x^2 + eps) over the last dim: the query and key normalisation of Gated DeltaNet and KDA (as
    flash-linear-attention and transformers compute it)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor, *, scale: float | None = None,
                     initial_state: Tensor | None = None, output_final_state: bool = False, chunk_size: int = 64,
                     use_qk_l2norm: bool = False, key_mask: Tensor | None = None,
                     check_values: bool = True, backend: str = "auto") -> LinearAttentionOutput:
    """The gated delta rule (module docstring): Gated DeltaNet with ``g`` (B, H, L), one log-decay per head and
    token; Kimi Delta Attention with ``g`` (B, H, L, K), one per key channel; the plain delta rule with
    ``g=None``.

    Args:
        q, k: (B, Hk, L, K). v: (B, H, L, V), H a multiple of Hk.
        g: log-decays, <= 0 (a_t = exp(g_t) in (0, 1]), or None for no decay.
        beta: (B, H, L), the step of each token's update, in [0, 2] (Gated DeltaNet: a sigmoid, [0, 1]; 2 keeps
            the update a contraction for unit keys).
        scale: multiplies q (default 1 / sqrt(K)).
        initial_state: (B, H, K, V), the state before the first token (a previous call's ``final_state``).
        output_final_state: return the state after the last token.
        chunk_size: 1 for the token-by-token recurrence; larger for the exact chunked form.
        use_qk_l2norm: normalise q and k to unit length first (Qwen3-Next, Kimi Linear).
        key_mask: (B, L) True at real tokens: a padded token leaves the state untouched (its beta and decay
            are ignored) and gets a zero output.
        check_values: look at ``g``'s and ``beta``'s values and refuse any out of range by name (a wait for the
            device on a GPU; on the CPU most of a decoding step's checks). False for a caller whose g and
            beta are in range by construction, as attnkit's layers make them (a sigmoid; -exp(.) softplus(.)).
        backend: ``"auto"`` (flash-linear-attention's kernel for float16 and bfloat16 on CUDA where fla-core is
            installed, attnkit's forms otherwise), ``"torch"`` or ``"fla"`` (:mod:`.kernels`).

    Returns:
        :class:`LinearAttentionOutput` (output, final_state or None).
    """
    return _run(q, k, v, g, beta, delta=True, scale=scale, initial_state=initial_state,
                output_final_state=output_final_state, chunk_size=chunk_size, use_qk_l2norm=use_qk_l2norm,
                key_mask=key_mask, check_values=check_values, backend=backend)


def delta_rule(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, **options) -> LinearAttentionOutput:
    """The delta rule without decay (DeltaNet): :func:`gated_delta_rule` with ``g=None``."""
    return gated_delta_rule(q, k, v, None, beta, **options)


def gated_linear_attention(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, *, scale: float | None = None,
                           initial_state: Tensor | None = None, output_final_state: bool = False,
                           chunk_size: int = 64, key_mask: Tensor | None = None,
                           check_values: bool = True, backend: str = "auto") -> LinearAttentionOutput:
    """Gated linear attention, S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T, o_t = S_t^T (scale q_t): a decay and
    no delta. ``g`` (B, H, L) one log-decay per head and token (a constant per head is lightning attention),
    (B, H, L, K) per key channel (GLA), or None (the Linear Transformer's running sum, unnormalised). The
    other arguments as :func:`gated_delta_rule`'s."""
    return _run(q, k, v, g, None, delta=False, scale=scale, initial_state=initial_state,
                output_final_state=output_final_state, chunk_size=chunk_size, use_qk_l2norm=False,
                key_mask=key_mask, check_values=check_values, backend=backend)


def implicit_attention(q: Tensor, k: Tensor, g: Tensor | None, beta: Tensor | None, *, scale: float | None = None,
                       use_qk_l2norm: bool = False, key_mask: Tensor | None = None, chunk_size: int = 64,
                       num_heads: int | None = None) -> Tensor:
    """The (B, H, L, L) lower-triangular matrix A with output = A v of :func:`gated_delta_rule` (``beta`` given)
    or :func:`gated_linear_attention` (``beta=None``) from a zero initial state: the linear layer's attention
    weights, exact (computed as the rule's output for values that are the L unit vectors). Row i says how much
    of each earlier token's value reaches token i's output; unlike softmax weights a row need not sum to one,
    and entries may be negative (the delta rule subtracts what the state predicted). The value heads H are
    ``beta``'s or ``g``'s; with neither, ``num_heads`` (default: q's heads)."""
    B, H, L = (beta if beta is not None else g if g is not None else q).shape[:3]
    if beta is None and g is None and num_heads is not None:
        H = num_heads
    eye = torch.eye(L, dtype=accumulation_dtype(q.dtype), device=q.device).expand(B, H, L, L)
    if beta is None:
        return gated_linear_attention(q, k, eye, g, scale=scale, chunk_size=chunk_size, key_mask=key_mask,
                                      backend="torch").output
    return gated_delta_rule(q, k, eye, g, beta, scale=scale, chunk_size=chunk_size, use_qk_l2norm=use_qk_l2norm,
                            key_mask=key_mask, backend="torch").output


# ----------------------------------------------------------------------------------- the shared machinery
def _run(q, k, v, g, beta, *, delta: bool, scale, initial_state, output_final_state, chunk_size, use_qk_l2norm,
         key_mask, check_values: bool = True, backend: str = "auto") -> LinearAttentionOutput:
    B, Hk, L, K, H, V = _check(q, k, v, g, beta, initial_state, chunk_size, key_mask, check_values, delta, scale)
    out_dtype = v.dtype
    real = None
    if key_mask is not None:  # a padded token: no write (k, v and beta 0), no decay (g 0), a zero output
        real = key_mask.to(device=v.device, dtype=torch.bool)[:, None, :, None]  # (B, 1, L, 1)
        # selected, not multiplied: a NaN or inf in a padded token's inputs reaches nothing (NaN x 0 is NaN)
        q, k, v = (torch.where(real, x, 0.0) for x in (q, k, v))
        beta = None if beta is None else torch.where(real[..., 0], beta, 0.0)
        if g is not None:
            g = torch.where(real[..., 0] if g.dim() == 3 else real, g, 0.0)
    scale = K**-0.5 if scale is None else float(scale)
    if uses_fla(backend, q, k, v, chunk_size, g, beta, initial_state) and L > 0:
        # flash-linear-attention's kernel for the same call (.kernels)
        out, state = fla_linear(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                output_final_state=output_final_state, use_qk_l2norm=use_qk_l2norm)
    else:
        out, state = _torch_forms(q, k, v, g, beta, delta=delta, scale=scale, initial_state=initial_state,
                                  chunk_size=chunk_size, use_qk_l2norm=use_qk_l2norm)
    if real is not None:
        out = torch.where(real, out, 0.0)
    return LinearAttentionOutput(out.to(out_dtype), state if output_final_state else None)


def _torch_forms(q, k, v, g, beta, *, delta: bool, scale: float, initial_state, chunk_size: int,
                 use_qk_l2norm: bool) -> tuple[Tensor, Tensor]:
    """attnkit's own forms (backend "torch"), on checked inputs with padded tokens already selected away: (output
    in the accumulation dtype, final state)."""
    B, Hk, L, K = q.shape
    H, V = v.shape[1], v.shape[-1]
    if beta is None:  # gated linear attention: the update is the value itself
        beta = v.new_ones(B, H, L)
    acc = accumulation_dtype(q.dtype)
    groups = H // Hk
    # gated linear attention with a decay a head (or none), chunked: the key heads stay shared (_chunked_shared)
    shared = not delta and (g is None or g.dim() == 3) and L > 1 and chunk_size > 1
    q, k = (x.to(acc) if groups == 1 or shared else x.to(acc).repeat_interleave(groups, dim=1) for x in (q, k))
    if use_qk_l2norm:  # one multiply each: the norm's inverse and the scale together
        q = q * (torch.rsqrt((q * q).sum(dim=-1, keepdim=True) + 1e-6) * scale)
        k = l2norm(k)
    else:
        q = q * scale
    v, beta = v.to(acc), beta.to(acc)
    g = None if g is None else g.to(acc)
    state = None if initial_state is None else initial_state.to(acc)
    if L == 0:  # no token: an empty output, the state as it was (as attention() gives an empty output), both in
        # every input's graph (a backward through them gives zero gradients, not an error): the sums of empty
        # tensors are exact zeros
        anchor = q.sum() + k.sum() + v.sum() + beta.sum() + (0.0 if g is None else g.sum())
        out = v * 0.0 + anchor
        state = (q.new_zeros(B, H, K, V) if state is None else state) + anchor
    elif L == 1:  # a decoding step: the recurrence's one step in five small products (_step)
        out, state = _step(q, k, v, g, beta, state, delta)
    elif chunk_size == 1:
        out, state = _recurrent(q, k, v, g, beta, state, delta)
    elif shared:
        out, state = _chunked_shared(q, k, v, g, state, chunk_size)
    else:
        out, state = _chunked(q, k, v, g, beta, state, delta, chunk_size)
    return out, state


def _recurrent(q, k, v, g, beta, state, delta: bool):
    """Token by token: the recurrence of the module docstring, written out (the reference the chunked form is
    held to)."""
    B, H, L, K = k.shape
    V = v.shape[-1]
    S = q.new_zeros(B, H, K, V) if state is None else state.clone()
    out = []
    for t in range(L):
        if g is not None:
            decay = g[:, :, t].exp()
            S = S * (decay[..., None, None] if g.dim() == 3 else decay[..., :, None])
        k_t = k[:, :, t]
        if delta:
            predicted = (S * k_t[..., None]).sum(dim=-2)  # S^T k_t
            update = (v[:, :, t] - predicted) * beta[:, :, t, None]
        else:
            update = v[:, :, t]
        S = S + k_t[..., None] * update[..., None, :]
        out.append((S * q[:, :, t, :, None]).sum(dim=-2))  # S^T q_t
    return torch.stack(out, dim=2), S


def _step(q, k, v, g, beta, state, delta: bool):
    """One token (B, H, 1, .): the recurrence of the module docstring as products of (1, K) rows and the (K, V)
    state, the same numbers as :func:`_recurrent`'s one step to rounding. A decoding step of a hybrid model runs
    it on every linear layer, where the chunked form's one chunk and the token loop each cost several times more
    (benchmarks/linear_attention.py's decoding rows time the step)."""
    B, H, _, K = k.shape
    S = q.new_zeros(B, H, K, v.shape[-1]) if state is None else state
    if g is not None:  # (B, H, 1): one decay a head; (B, H, 1, K): one a key channel, down the state's rows
        decay = g.exp()
        S = S * (decay[..., None] if g.dim() == 3 else decay.transpose(-1, -2))
    update = (v - k @ S) * beta[..., None] if delta else v  # beta (v - S^T k), as rows: (B, H, 1, V)
    S = S + k.transpose(-1, -2) @ update  # the outer product k update^T
    return q @ S, S  # S^T q, as a row


def _chunked(q, k, v, g, beta, state, delta: bool, C: int):
    """The exact chunked form (module docstring): every chunk's inner quantities at once, then one pass of
    the state over the chunks. Diagonal scalings (beta, the decays) are applied to the C x C matrices or to
    the chunk's outputs rather than to whole q, k, v tensors: each full-size pass costs as much as a matmul
    here (measured on 2 cores)."""
    B, H, L, K = k.shape
    V = v.shape[-1]
    C = max(1, min(C, L))  # a call shorter than a chunk (a decoding step) is one chunk of its own length
    pad = (-L) % C
    if pad:  # padded tokens: no update, no decay, outputs dropped
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        beta = F.pad(beta, (0, pad))
        g = None if g is None else F.pad(g, (0, pad) if g.dim() == 3 else (0, 0, 0, pad))
    N = (L + pad) // C
    q, k, v = (x.reshape(B, H, N, C, x.shape[-1]) for x in (q, k, v))
    beta = beta.reshape(B, H, N, C)
    qk = q @ k.transpose(-1, -2)  # (B, H, N, C, C)
    kk = k @ k.transpose(-1, -2) if delta else None
    rows = cols = end = None  # the decays as scalings: of a chunk's rows (outputs), of the state's keys
    if g is not None and g.dim() == 3:  # one decay a head: exp(gamma_i - gamma_j) on the C x C matrices
        gamma = g.reshape(B, H, N, C).cumsum(dim=-1)  # running log-decay inside each chunk
        causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
        # j <= i kept before the exp: an upper entry's exponent is > 0 and may overflow (inf, and NaN gradients)
        decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~causal, -math.inf).exp()
        qk = qk * decay  # (in place only where autograd keeps no operand: below)
        kk = None if kk is None else kk * decay
        rows = gamma.exp()  # (B, H, N, C): exp(gamma_i), the state's decay at token i
        cols = (gamma[..., -1:] - gamma).exp()  # exp(gamma_C - gamma_j), token j's decay until the chunk's end
        end = rows[..., -1, None, None]  # (B, H, N, 1, 1)
    elif g is not None:  # per key channel: exp(gamma_ic - gamma_jc) pairwise, by blocks of chunks
        gamma = g.reshape(B, H, N, C, K).cumsum(dim=-2)
        qk, kk = _channel_decayed(q, k, gamma, delta)
        q, k_in = q * gamma.exp(), k * gamma.exp()
        k_out = k * (gamma[..., -1:, :] - gamma).exp()
        end = gamma[..., -1, :].exp()[..., None]  # (B, H, N, K, 1)
    qk = qk.tril_()
    if delta:
        A = (kk * beta[..., :, None]).tril_(-1)
        eye = torch.eye(C, dtype=q.dtype, device=q.device)
        T = torch.linalg.solve_triangular(A.add_(eye), eye.expand_as(A), upper=False, unitriangular=True)  # (I+A)^-1
        T = T * beta[..., None, :]  # T diag(beta): beta applied to the C x C matrix, not to v and k
        u0 = T @ v  # the new values, before the state's prediction is removed
        if rows is not None:
            w = (T * rows[..., None, :]) @ k  # T diag(beta exp(gamma)) k: what the state predicts, per unit of it
        else:
            w = T @ (k_in if g is not None else k)
    else:
        u0, w = v, None
    k_state = k if g is None or rows is not None else k_out  # the keys the state takes up at the chunk's end
    S = q.new_zeros(B, H, K, V) if state is None else state
    # Each chunk's slices taken once (unbind): indexing a chunk inside the loop would cost autograd a
    # full-size gradient per chunk, quadratic in the length (75 s for a 16K backward that takes 5 s now).
    u0s, qs, qks, ks = (x.unbind(2) for x in (u0, q, qk, k_state))
    optional: list[tuple[Tensor, ...] | list[None]] = [x.unbind(2) if x is not None else [None] * N
                                                       for x in (w, rows, cols, end)]
    out = []
    for n in range(N):
        u0_n, q_n, qk_n, k_n = u0s[n], qs[n], qks[n], ks[n]
        w_n, rows_n, cols_n, end_n = (c[n] for c in optional)
        u = u0_n if w_n is None else u0_n - w_n @ S
        read = q_n @ S  # the state's part of the output
        if rows_n is not None:
            read = read * rows_n[..., None]
        out.append(read + qk_n @ u)
        taken = u if cols_n is None else u * cols_n[..., None]
        carried = S if end_n is None else S * end_n
        S = carried + k_n.transpose(-1, -2) @ taken
    return torch.stack(out, dim=2).reshape(B, H, N * C, V)[:, :, :L], S


def _chunked_shared(q, k, v, g, state, C: int):
    """The chunked form of gated linear attention with one decay a head and token, or none (the SSD algorithm of
    Mamba-2, Dao and Gu 2024, section 6), for q and k of Hk key heads each serving G = H / Hk value heads, not
    repeated: a chunk's q k^T is made once a key head and decayed per value head. With no delta each chunk's new
    values are its values, so every step is batched over all chunks at once, and only the chunk-end states pass
    from chunk to chunk:

        within a chunk:  (q k^T * exp(gamma_i - gamma_j), j <= i) v
        chunk states:    K_n^T (v * exp(gamma_C - gamma_j))            (each chunk's own contribution)
        the pass:        S_n = exp(gamma_C) S_{n-1} + that             (one (K, V) product-free step a chunk)
        from the state:  exp(gamma_i) q_i S_{n-1}

    q, k (B, Hk, L, K); v (B, H, L, V); g (B, H, L) or None; state (B, H, K, V) or None."""
    B, Hk, L, K = k.shape
    H, V = v.shape[1], v.shape[-1]
    G = H // Hk
    C = max(1, min(C, L))
    pad = (-L) % C
    if pad:  # padded tokens: no update, no decay, outputs dropped
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g = None if g is None else F.pad(g, (0, pad))
    N = (L + pad) // C
    q, k = (x.reshape(B, Hk, N, C, K) for x in (q, k))
    v = v.reshape(B, Hk, G, N, C, V)
    qk = (q @ k.transpose(-1, -2))[:, :, None]  # (B, Hk, 1, N, C, C): once a key head
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    if g is None:
        scores = qk.masked_fill(~causal, 0.0)
        rows = cols = end = None
    else:
        gamma = g.reshape(B, Hk, G, N, C).cumsum(dim=-1)  # running log-decay inside each chunk
        # j <= i kept before the exp: an upper entry's exponent is > 0 and may overflow; exp(-inf) = 0 is the tril
        scores = qk * (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~causal, -math.inf).exp()
        rows = gamma.exp()  # (B, Hk, G, N, C): the state's decay at token i
        cols = (gamma[..., -1:] - gamma).exp()  # token j's decay until the chunk's end
        end = rows[..., -1].permute(0, 1, 3, 2)[..., None, :, None]  # (B, Hk, N, 1, G, 1)
    out = scores @ v  # (B, Hk, G, N, C, V): within the chunks
    # The state parts as products of a key head's q or k with its G value heads side by side (K, G V): large
    # matrix products, where a product broadcast over the G heads would copy q and k G times.
    taken = v if cols is None else v * cols[..., None]
    taken = taken.permute(0, 1, 3, 4, 2, 5).reshape(B, Hk, N, C, G * V)
    written = (k.transpose(-1, -2) @ taken).view(B, Hk, N, K, G, V)  # each chunk's own contribution
    S = (q.new_zeros(B, Hk, K, G, V) if state is None
         else state.reshape(B, Hk, G, K, V).transpose(2, 3))  # (B, Hk, K, G, V)
    before = []  # the state before each chunk
    for n, written_n in enumerate(written.unbind(2)):
        before.append(S)
        S = (S if end is None else S * end[:, :, n]) + written_n
    read = (q @ torch.stack(before, dim=2).reshape(B, Hk, N, K, G * V)).view(B, Hk, N, C, G, V)
    read = read.permute(0, 1, 4, 2, 3, 5)  # (B, Hk, G, N, C, V): from the state
    out = out + (read if rows is None else read * rows[..., None])
    return out.reshape(B, H, N * C, V)[:, :, :L], S.transpose(2, 3).reshape(B, H, K, V)


def _channel_decayed(q: Tensor, k: Tensor, gamma: Tensor, delta: bool) -> tuple[Tensor, Tensor | None]:
    """Per-channel decays (Kimi Delta Attention): qk_ij = sum_c q_ic k_jc exp(gamma_ic - gamma_jc) and the same
    for k k, j <= i (upper entries left for the caller's tril), by blocks of chunks so that the pairwise
    (C, C, K) decays of at most ``PAIR_ELEMENTS`` numbers exist at once."""
    B, H, N, C, K = q.shape
    qk = q.new_empty(B, H, N, C, C)
    kk = q.new_empty(B, H, N, C, C) if delta else None
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    step = max(1, PAIR_ELEMENTS // max(1, B * H * C * C * K))
    for n0 in range(0, N, step):
        n1 = min(N, n0 + step)
        part = gamma[:, :, n0:n1]
        pair = (part[..., :, None, :] - part[..., None, :, :]).masked_fill(~causal[..., None], -math.inf).exp()
        qk[:, :, n0:n1] = torch.einsum("...ic,...jc,...ijc->...ij", q[:, :, n0:n1], k[:, :, n0:n1], pair)
        if kk is not None:
            kk[:, :, n0:n1] = torch.einsum("...ic,...jc,...ijc->...ij", k[:, :, n0:n1], k[:, :, n0:n1], pair)
    return qk, kk


PAIR_ELEMENTS = 1 << 24
"""The most numbers of per-channel pairwise decays (B H x chunks x C x C x K) :func:`_channel_decayed` makes at
once (64 MB in float32)."""


def _check(q, k, v, g, beta, initial_state, chunk_size, key_mask, check_values: bool = True, delta: bool = True,
           scale=None):
    """Sizes (B, Hk, L, K, H, V), every argument checked (the values of g and beta where ``check_values``); each
    error names the argument, what it should be and what it is."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor) or x.dim() != 4:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"{name} must be a 4-D tensor, (B, H, L, K) for q and k, (B, H, L, V) for v, got {got}")
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("initial_state", initial_state)):
        if isinstance(x, Tensor) and not x.is_floating_point():  # (an int v would come back truncated; complex: no)
            raise TypeError(f"{name} must be a real floating-point tensor, got {x.dtype}")
    B, Hk, L, K = q.shape
    if K == 0:
        raise ValueError(f"q and k must have a key dim K >= 1, got q of shape {tuple(q.shape)}")
    if tuple(k.shape) != (B, Hk, L, K):
        raise ValueError(f"k must have q's shape (B, Hk, L, K) = {(B, Hk, L, K)}, got {tuple(k.shape)}")
    if v.shape[0] != B or v.shape[2] != L:
        raise ValueError(f"v must be (B, H, L, V) with B={B}, L={L}, got {tuple(v.shape)}")
    H, V = v.shape[1], v.shape[3]
    if Hk == 0 or H % Hk:
        raise ValueError(f"v's heads H={H} must be a multiple of q's and k's heads Hk={Hk} (each key head serves "
                         "H / Hk value heads)")
    if (delta or beta is not None) and (not isinstance(beta, Tensor) or tuple(beta.shape) != (B, H, L)):
        got = tuple(beta.shape) if isinstance(beta, Tensor) else type(beta).__name__
        raise ValueError(f"beta must have shape (B, H, L) = {(B, H, L)}, got {got}")
    if g is not None and (not isinstance(g, Tensor) or tuple(g.shape) not in ((B, H, L), (B, H, L, K))):
        got = tuple(g.shape) if isinstance(g, Tensor) else type(g).__name__
        raise ValueError(f"g must have shape (B, H, L) (a decay per head) or (B, H, L, K) (per key channel) = "
                         f"{(B, H, L)} or {(B, H, L, K)}, got {got}")
    if initial_state is not None and (not isinstance(initial_state, Tensor) or tuple(initial_state.shape) != (B, H, K, V)):
        got = tuple(initial_state.shape) if isinstance(initial_state, Tensor) else type(initial_state).__name__
        raise ValueError(f"initial_state must have shape (B, H, K, V) = {(B, H, K, V)}, got {got}")
    if key_mask is not None and (not isinstance(key_mask, Tensor) or tuple(key_mask.shape) != (B, L)
                                 or key_mask.is_floating_point()):
        found = (key_mask.dtype, tuple(key_mask.shape)) if isinstance(key_mask, Tensor) else type(key_mask).__name__
        raise ValueError(f"key_mask must be boolean (or 0/1) of shape (B, L) = {(B, L)}, True at real tokens, got {found}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an int >= 1 (1: the token-by-token recurrence), got {chunk_size!r}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number (or None for 1/sqrt(K)), got {scale!r}")
    if not isinstance(check_values, bool):
        raise TypeError(f"check_values must be True or False, got {type(check_values).__name__} {check_values!r}")
    # A look at the values (a host sync on a GPU), refused by name. Not while compiling, where a look would break the
    # graph: a compiled call takes g and beta as they are (docs/linear.md).
    if check_values and not torch.compiler.is_compiling():
        if key_mask is not None:  # a padded token's g and beta are ignored: only the real tokens' are looked at
            real = key_mask.to(device=beta.device if beta is not None else v.device, dtype=torch.bool)[:, None]
            g = None if g is None else torch.where(real if g.dim() == 3 else real[..., None], g, 0.0)
            beta = None if beta is None else torch.where(real, beta, 0.0)
        if g is not None and g.numel() and not bool(((g <= 0) & (g > -math.inf)).all()):  # (NaN fails both)
            bad = g[~((g <= 0) & (g > -math.inf))]
            raise ValueError(f"g must be finite and <= 0 (log-decays: the state is multiplied by exp(g) <= 1), got "
                             f"{float(bad[0]):.4g}; for a full reset give a large finite negative value such as -100 "
                             "(exp(-100) is 0 to float32's precision): the chunked form cannot take -inf")
        if delta and beta is not None and beta.numel() and not bool(((beta >= 0) & (beta <= 2)).all()):  # (gated linear attention's: ones)
            bad = beta[~((beta >= 0) & (beta <= 2))]
            raise ValueError(f"beta must lie in [0, 2], got {float(bad[0]):.4g}")
    return B, Hk, L, K, H, V
