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

from .delta import LinearAttentionOutput, gated_linear_attention

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
    if not isinstance(x, Tensor) or x.dim() != 4:
        raise ValueError(f"x must be a 4-D tensor (B, H, L, P), got {tuple(x.shape) if isinstance(x, Tensor) else x!r}")
    Bsz, H, L, P = x.shape
    if not isinstance(dt, Tensor) or tuple(dt.shape) != (Bsz, H, L):
        raise ValueError(f"dt must have shape (B, H, L) = {(Bsz, H, L)}, got "
                         f"{tuple(dt.shape) if isinstance(dt, Tensor) else dt!r}")
    if not isinstance(A, Tensor) or tuple(A.shape) != (H,):
        raise ValueError(f"A must have shape (H,) = ({H},), got {tuple(A.shape) if isinstance(A, Tensor) else A!r}")
    if D is not None and (not isinstance(D, Tensor) or tuple(D.shape) not in ((H,), (H, P))):
        raise ValueError(f"D must have shape (H,) = ({H},) or (H, P) = ({H}, {P}), got "
                         f"{tuple(D.shape) if isinstance(D, Tensor) else D!r}")
    dt, g = ssd_decays(dt, A, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit)
    v = x * dt[..., None].to(x.dtype)  # (B, H, L, P): the input the state takes up, dt x
    result = gated_linear_attention(C, B, v, g, scale=1.0, initial_state=initial_state,
                                    output_final_state=output_final_state, chunk_size=chunk_size, key_mask=key_mask,
                                    check_values=check_values, backend=backend)
    if D is None:
        return result
    skip = x * (D[:, None, None] if D.dim() == 1 else D[:, None, :]).to(x.dtype)  # (B, H, L, P)
    if key_mask is not None:
        skip = torch.where(key_mask.bool()[:, None, :, None], skip, 0.0)
    return LinearAttentionOutput(result.output + skip, result.final_state)
