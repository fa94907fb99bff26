"""Linear attention: kernel feature maps and (causal) prefix sums.

Katharopoulos et al. 2020, "Transformers are RNNs": replace softmax(q k^T) by phi(q) phi(k)^T,

    out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / phi(q_i)^T (sum_j phi(k_j))

so the cost is linear in length; in the causal form the two sums run over j <= i and can be
carried as a running state (S_i = S_{i-1} + phi(k_i) v_i^T, z_i = z_{i-1} + phi(k_i)), constant
memory per generated token. Performer (Choromanski et al. 2021, FAVOR+) picks phi as positive
random features whose inner products estimate exp(q.k / sqrt(E)) without bias.

Shapes: B batch, H heads, L queries, S keys, E head dim, M features, Ev value dim.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._deprecated import UNSET, renamed
from ..checks import check_int, check_rank

__all__ = ["elu_feature_map", "favor_features", "orthogonal_projection", "linear_attention", "causal_linear_step"]


def elu_feature_map(x: Tensor) -> Tensor:
    """phi(x) = elu(x) + 1 > 0 (Katharopoulos et al. 2020)."""
    return F.elu(x) + 1


def orthogonal_projection(num_features: int, dim: int, *, generator: torch.Generator | None = None) -> Tensor:
    """(M, E) random projection with orthogonal blocks of rows and chi-distributed norms, as
    FAVOR+'s "ORF" (rows within each block of E are exactly orthogonal)."""
    blocks = []
    for _ in range(math.ceil(num_features / dim)):
        q, _ = torch.linalg.qr(torch.randn(dim, dim, generator=generator, dtype=torch.float64))
        blocks.append(q.T)
    rows = torch.cat(blocks)[:num_features]
    norms = torch.randn(num_features, dim, generator=generator, dtype=torch.float64).norm(dim=1)
    return (rows * norms[:, None]).float()


def favor_features(x: Tensor, projection: Tensor, *, is_query: bool, is_causal=UNSET, causal=UNSET) -> Tensor:
    """Positive random features of x (..., L, E) for softmax attention with scale 1/sqrt(E):

        phi(x) = exp(w^T x' - |x'|^2 / 2 - c) / sqrt(M),  x' = x / E^(1/4)

    so that E[phi(q)^T phi(k)] is proportional to exp(q.k / sqrt(E)). The stabiliser c cancels in
    the normalisation: the row maximum for queries, the maximum over all keys for keys, except in
    the causal form, where a maximum over all keys would let later tokens change earlier outputs
    (in rounding), so keys get c = 0 there. ``causal`` is the deprecated old name of ``is_causal``."""
    is_causal = renamed("favor_features", "causal", "is_causal", causal, is_causal, False)
    E = x.shape[-1]
    x = x * E**-0.25
    projected = x @ projection.to(x.dtype).T  # (..., L, M)
    energy = projected - (x * x).sum(-1, keepdim=True) / 2
    if is_query:
        energy = energy - energy.amax(-1, keepdim=True).detach()
    elif not is_causal:
        energy = energy - energy.amax(dim=(-2, -1), keepdim=True).detach()
    return torch.exp(energy) / math.sqrt(projection.shape[0])


def linear_attention(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    *,
    is_causal=UNSET,
    key_mask: Tensor | None = None,
    chunk: int = 64,
    eps: float = 1e-6,
    causal=UNSET,
) -> Tensor:
    """out (B, H, L, Ev) from features phi_q (B, H, L, M), phi_k (B, H, S, M) and v (B, H, S, Ev).

    ``is_causal`` (L == S) uses keys j <= i only, computed in chunks: exact (quadratic) inside a
    chunk of ``chunk`` positions, a carried state between chunks; memory O(chunk^2 + M Ev) per head.
    ``key_mask`` (B, S), True at real keys, removes padded keys from both sums. ``causal`` is the
    deprecated old name of ``is_causal``.
    """
    is_causal = renamed("linear_attention", "causal", "is_causal", causal, is_causal, False)
    check_rank("phi_q", phi_q, 4, "(B, H, L, M)")
    check_rank("phi_k", phi_k, 4, "(B, H, S, M)")
    check_rank("v", v, 4, "(B, H, S, Ev)")
    if phi_q.shape[-1] != phi_k.shape[-1] or phi_k.shape[:3] != v.shape[:3] or phi_q.shape[:2] != phi_k.shape[:2]:
        raise ValueError(
            f"shapes do not fit: phi_q {tuple(phi_q.shape)}, phi_k {tuple(phi_k.shape)}, v {tuple(v.shape)}"
        )
    check_int("chunk", chunk, 1)
    if key_mask is not None:
        if tuple(key_mask.shape) != (phi_k.shape[0], phi_k.shape[2]):
            raise ValueError(f"key_mask must have shape (B, S) = {(phi_k.shape[0], phi_k.shape[2])}, got {tuple(key_mask.shape)}")
        keep = key_mask[:, None, :, None].bool()  # selected, not multiplied: a padded key's NaN reaches nothing
        phi_k, v = torch.where(keep, phi_k, 0.0), torch.where(keep, v, 0.0)
    if not is_causal:
        kv = phi_k.transpose(-2, -1) @ v  # (B, H, M, Ev)
        z = phi_k.sum(-2)  # (B, H, M)
        return (phi_q @ kv) / ((phi_q * z[..., None, :]).sum(-1, keepdim=True) + eps)
    L = phi_q.shape[2]
    if phi_k.shape[2] != L:
        raise ValueError(f"causal linear attention needs L == S, got L={L}, S={phi_k.shape[2]}")
    B, H, _, M = phi_q.shape
    state = phi_q.new_zeros(B, H, M, v.shape[-1])
    total = phi_q.new_zeros(B, H, M)
    outputs = []
    for start in range(0, L, chunk):
        q, k, val = (t[:, :, start : start + chunk] for t in (phi_q, phi_k, v))
        inside = torch.tril(q @ k.transpose(-2, -1))  # (B, H, n, n): keys of this chunk up to i
        numerator = q @ state + inside @ val
        denominator = (q * total[..., None, :]).sum(-1, keepdim=True) + inside.sum(-1, keepdim=True)
        outputs.append(numerator / (denominator + eps))
        state = state + k.transpose(-2, -1) @ val
        total = total + k.sum(-2)
    return torch.cat(outputs, dim=2)


def causal_linear_step(
    phi_q: Tensor, phi_k: Tensor, v: Tensor, state: tuple[Tensor, Tensor] | None = None, *, eps: float = 1e-6
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """One generated token, phi_q/phi_k (B, H, M), v (B, H, Ev): output (B, H, Ev) and the new
    running state (S (B, H, M, Ev), z (B, H, M)); memory does not grow with the position."""
    if state is None:
        state = (phi_q.new_zeros(*phi_k.shape, v.shape[-1]), phi_q.new_zeros(phi_k.shape))
    S, z = state
    S = S + phi_k[..., :, None] * v[..., None, :]
    z = z + phi_k
    out = (phi_q[..., None, :] @ S)[..., 0, :] / ((phi_q * z).sum(-1, keepdim=True) + eps)
    return out, (S, z)
