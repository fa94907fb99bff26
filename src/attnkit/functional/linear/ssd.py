r"""Mamba-2's state-space layer as linear attention: state-space duality (Dao and Gu 2024, "Transformers are SSMs").

Mamba-2's selective state space, per head h with a scalar decay, reads

    h_t = exp(dt_t A_h) h_{t-1} + (dt_t x_t) B_t^T,     y_t = h_t C_t + D_h x_t

with x_t (P,) the head's input, B_t and C_t (N,) shared by the heads of a group, dt_t > 0 a step and A_h < 0. It
is gated linear attention (:func:`.delta.gated_linear_attention`) with q = C, k = B, v = dt x, a log-decay
g = dt A a head and token, no scale, one key group serving H / G heads, plus the skip D x: the same exact chunked
and recurrent forms compute it, and :func:`.delta.implicit_attention` gives its L x L attention matrix (row i: how
much of each earlier token's dt x reaches y_i).

Layout (B, H, L, .) like every attnkit function: x (B, H, L, P), dt (B, H, L), B and C (B, G, L, N); the state
(B, H, N, P) in float32 (float64 for float64 inputs). transformers' Mamba-2 keeps (B, L, H, P) and its state as
(B, H, P, N): the transposes of these.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..precision import accumulation_dtype
from .delta import LinearAttentionOutput, gated_linear_attention
from .kernels import uses_fla

__all__ = ["ssd", "ssd_decays"]


def ssd_decays(dt: Tensor, A: Tensor, *, dt_bias: Tensor | None = None, dt_softplus: bool = True,
               dt_limit: tuple[float, float] = (0.0, math.inf)) -> tuple[Tensor, Tensor]:
    """(dt, g): Mamba-2's step of each head and token, (B, H, L), as its layer makes it (``dt + dt_bias``, then a
    softplus where ``dt_softplus``, clamped to ``dt_limit``), and the log-decay g = dt A (<= 0 for A <= 0)."""
    H = dt.shape[1]
    if dt_bias is not None:
        if tuple(dt_bias.shape) != (H,):
            raise ValueError(f"dt_bias must have shape (H,) = ({H},), got {tuple(dt_bias.shape)}")
        dt = dt + dt_bias.to(dt.dtype)[:, None]
    if dt_softplus:
        dt = F.softplus(dt)
    low, high = dt_limit
    if not (isinstance(low, (int, float)) and isinstance(high, (int, float)) and 0 <= low <= high):
        raise ValueError(f"dt_limit must be (low, high) with 0 <= low <= high, got {dt_limit!r}")
    if low > 0 or high < math.inf:
        dt = dt.clamp(min=low, max=high)
    return dt, dt * A.to(dt.dtype)[:, None]


def ssd(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, *, D: Tensor | None = None,
        dt_bias: Tensor | None = None, dt_softplus: bool = True, dt_limit: tuple[float, float] = (0.0, math.inf),
        initial_state: Tensor | None = None, output_final_state: bool = False, chunk_size: int = 64,
        key_mask: Tensor | None = None, check_values: bool = True, backend: str = "auto") -> LinearAttentionOutput:
    """Mamba-2's selective state space (module docstring), through attnkit's linear-attention core.

    Args:
        x: (B, H, L, P) the heads' inputs. dt: (B, H, L) the steps before ``dt_bias`` and the softplus.
        A: (H,), <= 0 (Mamba-2 keeps ``A_log``: A = -exp(A_log)).
        B, C: (B, G, L, N), H a multiple of G (each group serves H / G consecutive heads).
        D: (H,) or (H, P), the skip ``D x``; None for none.
        dt_bias, dt_softplus, dt_limit: how the step is made (:func:`ssd_decays`), as Mamba-2's layer makes it.
        initial_state: (B, H, N, P), the state before the first token; ``output_final_state`` returns the last.
        chunk_size: 1 for the token-by-token recurrence; larger for the exact chunked form.
        key_mask: (B, L) True at real tokens: a padded token writes nothing, decays nothing and gets zeros.
        check_values: refuse a positive, NaN or -inf log-decay (A > 0, or a NaN step) by name (a look at the
            values; False for a caller whose A and dt are in range by construction).
        backend: ``"auto"``, ``"torch"`` or ``"fla"``: whose kernel computes the scan (:mod:`.kernels`; fla's
            ``chunk_simple_gla`` for float16 and bfloat16 on CUDA where fla-core is installed).

    Returns:
        :class:`~.delta.LinearAttentionOutput`: y (B, H, L, P) in x's dtype, the final state or None.
    """
    Bsz, H, L, P, N = _check(x, dt, A, B, C, D, dt_bias, initial_state, chunk_size, key_mask)
    acc = accumulation_dtype(x.dtype)  # the steps, dt x and dt A in float32 (float64) whatever x's dtype, as
    real = None                        # transformers forms them: a bfloat16 step rounds every product it enters
    if key_mask is not None:  # a padded token's x and dt selected away first: a NaN there reaches no gradient
        real = key_mask.to(device=x.device, dtype=torch.bool)[:, None, :]  # (B, 1, L)
        x, dt = torch.where(real[..., None], x, 0.0), torch.where(real, dt, 0.0)
    dt, g = ssd_decays(dt.to(acc), A, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit)
    if check_values and not torch.compiler.is_compiling():  # (the inner call's look, named by ssd's arguments)
        _check_decays(g, dt, A, real)
    v = x.to(acc) * dt[..., None]  # (B, H, L, P): the input the state takes up, dt x
    if uses_fla(backend, C, B, x, chunk_size, g, initial_state):  # fla's kernels take q, k and v in one dtype
        v = v.to(x.dtype)
    result = gated_linear_attention(C, B, v, g, scale=1.0, initial_state=initial_state,
                                    output_final_state=output_final_state, chunk_size=chunk_size, key_mask=key_mask,
                                    check_values=False, backend=backend)
    y = result.output
    if D is not None:
        skip = x.to(acc) * (D[:, None, None] if D.dim() == 1 else D[:, None, :]).to(acc)  # (B, H, L, P)
        y = y + (skip if real is None else torch.where(real[..., None], skip, 0.0))
    return LinearAttentionOutput(y.to(x.dtype), result.final_state)


def _check(x, dt, A, B, C, D, dt_bias, initial_state, chunk_size, key_mask) -> tuple[int, int, int, int, int]:
    """Sizes (B, H, L, P, N) of an :func:`ssd` call, every argument checked by its own name (the inner gated
    linear attention's names, q, k, v and g, are not the caller's)."""
    def shape(t) -> object:
        return tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__

    if not isinstance(x, Tensor) or x.dim() != 4:
        raise ValueError(f"x must be a 4-D tensor (B, H, L, P), got {shape(x)}")
    for name, t in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D), ("dt_bias", dt_bias),
                    ("initial_state", initial_state)):
        if isinstance(t, Tensor) and not t.is_floating_point():
            raise TypeError(f"{name} must be a real floating-point tensor, got {t.dtype}")
    Bsz, H, L, P = x.shape
    if not isinstance(dt, Tensor) or tuple(dt.shape) != (Bsz, H, L):
        raise ValueError(f"dt must have shape (B, H, L) = {(Bsz, H, L)}, got {shape(dt)}")
    if not isinstance(A, Tensor) or tuple(A.shape) != (H,):
        raise ValueError(f"A must have shape (H,) = ({H},), got {shape(A)}")
    if not isinstance(B, Tensor) or B.dim() != 4 or B.shape[0] != Bsz or B.shape[2] != L:
        raise ValueError(f"B must have shape (B, G, L, N) with B={Bsz}, L={L}, got {shape(B)}")
    G, N = B.shape[1], B.shape[3]
    if G == 0 or H % G or N == 0:
        raise ValueError(f"B's groups G={G} must divide x's heads H={H} (each group serves H / G heads) and its state "
                         f"size N={N} be >= 1, got B of shape {tuple(B.shape)}")
    if not isinstance(C, Tensor) or tuple(C.shape) != tuple(B.shape):
        raise ValueError(f"C must have B's shape (B, G, L, N) = {tuple(B.shape)}, got {shape(C)}")
    if D is not None and (not isinstance(D, Tensor) or tuple(D.shape) not in ((H,), (H, P))):
        raise ValueError(f"D must have shape (H,) = ({H},) or (H, P) = ({H}, {P}), got {shape(D)}")
    if dt_bias is not None and (not isinstance(dt_bias, Tensor) or tuple(dt_bias.shape) != (H,)):
        raise ValueError(f"dt_bias must have shape (H,) = ({H},), got {shape(dt_bias)}")
    if initial_state is not None and (not isinstance(initial_state, Tensor)
                                      or tuple(initial_state.shape) != (Bsz, H, N, P)):
        raise ValueError(f"initial_state must have shape (B, H, N, P) = {(Bsz, H, N, P)}, got {shape(initial_state)}")
    if key_mask is not None and (not isinstance(key_mask, Tensor) or tuple(key_mask.shape) != (Bsz, L)
                                 or key_mask.is_floating_point()):
        found = (key_mask.dtype, tuple(key_mask.shape)) if isinstance(key_mask, Tensor) else type(key_mask).__name__
        raise ValueError(f"key_mask must be boolean (or 0/1) of shape (B, L) = {(Bsz, L)}, True at real tokens, "
                         f"got {found}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an int >= 1 (1: the token-by-token recurrence), got {chunk_size!r}")
    return Bsz, H, L, P, N


def _check_decays(g: Tensor, dt: Tensor, A: Tensor, real: Tensor | None) -> None:
    """Refuse by name a step and an A whose log-decay dt A is not finite and <= 0 at a real token (A > 0, a NaN
    or infinite step): a look at the values, as the linear core's ``check_values`` looks."""
    ok = (g <= 0) & (g > -math.inf)  # (NaN fails both)
    if real is not None:
        ok = ok | ~real
    if g.numel() and not bool(ok.all()):
        b, h, t = (int(i) for i in (~ok).nonzero()[0])
        raise ValueError(f"dt and A must give a finite log-decay dt x A <= 0 (A <= 0, a finite step), got dt = "
                         f"{float(dt[b, h, t]):.4g} (after dt_bias, the softplus and dt_limit) and A = "
                         f"{float(A[h]):.4g} at batch {b}, head {h}, token {t}")
