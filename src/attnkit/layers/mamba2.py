r"""Mamba-2's mixer (Dao and Gu 2024), the state-space layer of Mamba-2, Bamba, Nemotron-H, Falcon-H1 and Granite
4.0, on attnkit's linear core.

    [z ; xBC ; dt] = x W_in                                   (a gate, the SSM's inputs, one step a head)
    xBC = silu(causal_conv1d(xBC))   ->   x, B, C              (a depthwise convolution over the last tokens)
    y = ssd(x, dt, A = -exp(A_log), B, C, D, dt_bias)          (attnkit.functional.linear.ssd: gated linear attention)
    out = W_out [RMSNorm_groups(y * silu(z))]                  (the gate first, then an RMSNorm per group)

Parameters carry transformers' names (``in_proj``, ``conv1d``, ``dt_bias``, ``A_log``, ``D``, ``norm.weight``,
``out_proj``), so a checkpoint's mixer tensors load as they are. The cache (:class:`~.delta.LinearStateCache`)
holds per sequence the convolution's last inputs and the state (H, N, P), whatever the length decoded; with
``need_weights`` the layer returns its implicit attention matrix (B, H, L, L), read by the inspection tools as a
softmax layer's weights.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..functional.attention import AttentionOutput, make_output
from ..functional.checks import check_int
from ..functional.linear import implicit_attention, ssd, ssd_decays
from ..functional.linear.kernels import check_backend
from ..functional.precision import accumulation_dtype
from .calls import called, project_by_name
from .delta import LinearStateCache, _checked_input, causal_convolution

__all__ = ["Mamba2", "GroupedGatedRMSNorm", "SSD_CHUNK"]

SSD_CHUNK = 64
"""The chunk attnkit's Mamba-2 layers scan by: on a CPU at Mamba-2-2.7B's shape, 64 takes half the time of the 256
checkpoints name for their GPU kernels (benchmarks/ssd.py); every chunk gives the same numbers to rounding."""


class GroupedGatedRMSNorm(nn.Module):
    """RMSNorm over groups of ``group_size`` channels, gated by silu(gate), in float32 (float64 for float64).

    By default the gate comes first: RMSNorm(y * silu(gate)), the weight applied in the input's dtype
    (transformers' ``MambaRMSNormGated``, Mamba-2's ``norm_before_gate=False``). With ``norm_before_gate`` the norm
    comes first: w RMSNorm(y) * silu(gate), the weight applied in float32 (Falcon-H1's ``FalconH1RMSNormGated``)."""

    def __init__(self, dim: int, group_size: int, eps: float = 1e-5, *, norm_before_gate: bool = False):
        super().__init__()
        check_int("group_size", group_size, 1)
        if dim % group_size:
            raise ValueError(f"dim={dim} must be a multiple of group_size={group_size}")
        self.weight = nn.Parameter(torch.ones(dim))
        self.group_size, self.eps, self.norm_before_gate = group_size, eps, norm_before_gate

    def forward(self, y: Tensor, gate: Tensor) -> Tensor:
        dtype = y.dtype
        acc = accumulation_dtype(dtype)  # (float32; float64 for a float64 layer)
        gated = torch.nn.functional.silu(gate.to(acc))
        h = y.to(acc) if self.norm_before_gate else y.to(acc) * gated
        grouped = h.unflatten(-1, (-1, self.group_size))
        normed = (grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)).flatten(-2)
        if self.norm_before_gate:
            return (self.weight.to(acc) * normed * gated).to(dtype)
        return self.weight * normed.to(dtype)


class Mamba2(nn.Module):
    """Mamba-2's mixer (module docstring): (B, L, D) -> :class:`AttentionOutput` with the output (B, L, D) and, with
    ``need_weights``, the implicit attention matrix (B, H, L, L) of the call's own tokens.

    Args:
        d_model: D. num_heads, head_dim: the SSM's heads and their width P (num_heads x head_dim channels: transformers'
            ``intermediate_size``). state_size: N. n_groups: G, the groups sharing B and C (num_heads a multiple).
        conv_kernel: the causal convolution's width (4); conv_bias: whether it has a bias (transformers'
            ``use_conv_bias``); bias: whether the projections have biases (``use_bias``).
        norm_eps: the gated RMSNorm's epsilon. chunk_size: the chunked form's chunk (1: the recurrence; the default
            :data:`SSD_CHUNK`).
        dt_limit: the steps' bounds (``time_step_limit``).
        norm: whether the output is normed (the grouped gated RMSNorm; without it, y * silu(z): Falcon-H1's
            ``mamba_rms_norm=False``). norm_before_gate: the norm before the gate (:class:`GroupedGatedRMSNorm`).
        out_bias: whether ``out_proj`` has a bias (default: ``bias``; Falcon-H1's ``projectors_bias``).
        projection_multipliers: five factors of ``in_proj``'s output sections z, x, B, C, dt (Falcon-H1's
            ``ssm_multipliers``, its muP vector), or None.
        backend: whose kernel computes the scan (:class:`~attnkit.layers.GatedDeltaNet`'s ``backend``).
    """

    def __init__(self, d_model: int, num_heads: int, head_dim: int, state_size: int, *, n_groups: int = 1,
                 conv_kernel: int = 4, conv_bias: bool = True, bias: bool = False, norm_eps: float = 1e-5,
                 chunk_size: int = SSD_CHUNK, dt_limit: tuple[float, float] = (0.0, math.inf), norm: bool = True,
                 norm_before_gate: bool = False, out_bias: bool | None = None,
                 projection_multipliers: tuple[float, ...] | None = None, backend: str = "auto"):
        super().__init__()
        self.backend = check_backend(backend)
        for name, value in (("d_model", d_model), ("num_heads", num_heads), ("head_dim", head_dim),
                            ("state_size", state_size), ("n_groups", n_groups), ("conv_kernel", conv_kernel),
                            ("chunk_size", chunk_size)):
            check_int(name, value, 1)
        if num_heads % n_groups:
            raise ValueError(f"num_heads={num_heads} must be a multiple of n_groups={n_groups}")
        self.d_model, self.num_heads, self.head_dim, self.state_size = d_model, num_heads, head_dim, state_size
        self.n_groups, self.conv_kernel, self.chunk_size, self.dt_limit = n_groups, conv_kernel, chunk_size, dt_limit
        self.inner = num_heads * head_dim
        self.conv_dim = self.inner + 2 * n_groups * state_size
        self.in_proj = nn.Linear(d_model, self.inner + self.conv_dim + num_heads, bias=bias)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, conv_kernel, groups=self.conv_dim, bias=conv_bias,
                                padding=conv_kernel - 1)
        self.dt_bias = nn.Parameter(torch.ones(num_heads))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, num_heads + 1, dtype=torch.float32)))
        self.D = nn.Parameter(torch.ones(num_heads))
        if norm:
            self.norm = GroupedGatedRMSNorm(self.inner, self.inner // n_groups, eps=norm_eps,
                                            norm_before_gate=norm_before_gate)
        self.out_proj = nn.Linear(self.inner, d_model, bias=bias if out_bias is None else out_bias)
        self.projection_multipliers: Tensor | None
        if projection_multipliers is None:
            self.projection_multipliers = None
        else:
            if len(projection_multipliers) != 5:
                raise ValueError(f"projection_multipliers must hold 5 factors (z, x, B, C, dt), got "
                                 f"{projection_multipliers!r}")
            sizes = (self.inner, self.inner, n_groups * state_size, n_groups * state_size, num_heads)
            vector = torch.cat([torch.full((size,), float(m)) for size, m in zip(sizes, projection_multipliers)])
            self.register_buffer("projection_multipliers", vector, persistent=False)

    def forward(self, x: Tensor, *, key_mask: Tensor | None = None, cache: LinearStateCache | None = None,
                need_weights: bool = False) -> AttentionOutput:
        """x (B, L, D); ``key_mask`` (B, L) True at real tokens (left padding: a padded token's input counts as
        zeros, it writes nothing into the state and gets zeros); ``cache`` carries the convolution and the state."""
        x = _checked_input(x, self.d_model, key_mask, cache)
        Bsz, L, _ = x.shape
        H, P, G, N = self.num_heads, self.head_dim, self.n_groups, self.state_size
        projected = project_by_name(self, "in_proj", x)
        if self.projection_multipliers is not None:
            projected = projected * self.projection_multipliers.to(projected.dtype)
        z, xBC, dt = projected.split([self.inner, self.conv_dim, H], dim=-1)
        conv = self.conv1d
        if key_mask is not None:  # a padded token's convolution input is zero, in_proj's bias too: a left-padded
            real = key_mask.bool()[..., None]  # row's real tokens see what they see alone (transformers' Mamba-2
            xBC = torch.where(real, xBC, 0.0)  # convolves the bias of its padded tokens into its first real ones)
        xBC = causal_convolution(xBC.transpose(1, 2), conv.weight, cache, conv.bias).transpose(1, 2)  # (B, L, C)
        if key_mask is not None:  # as transformers: a padded token's convolved inputs are zeros too
            xBC = torch.where(real, xBC, 0.0)
        xs, Bs, Cs = xBC.split([self.inner, G * N, G * N], dim=-1)
        xs = xs.reshape(Bsz, L, H, P).transpose(1, 2)  # (B, H, L, P)
        Bs, Cs = (t.reshape(Bsz, L, G, N).transpose(1, 2) for t in (Bs, Cs))  # (B, G, L, N)
        A = -self.A_log.to(accumulation_dtype(x.dtype)).exp()
        dt = dt.transpose(1, 2)  # (B, H, L)
        result = ssd(xs, dt, A, Bs, Cs, D=self.D, dt_bias=self.dt_bias, dt_limit=self.dt_limit,  # A <= 0, dt > 0 by make
                     initial_state=None if cache is None else cache.state, output_final_state=cache is not None,
                     chunk_size=self.chunk_size, key_mask=key_mask, check_values=False, backend=self.backend)
        if cache is not None:
            cache.state = result.final_state
            cache.position += L
        weights = None
        if need_weights:  # (B, H, L, L): how much of each earlier token's dt x reaches y_i (the skip D x aside)
            _, g = ssd_decays(dt, A, dt_bias=self.dt_bias, dt_limit=self.dt_limit)
            weights = implicit_attention(Cs, Bs, g, None, scale=1.0, key_mask=key_mask, num_heads=H)
        y = result.output.transpose(1, 2).reshape(Bsz, L, self.inner)
        norm = self._modules.get("norm")
        heads = y * torch.nn.functional.silu(z) if norm is None else called(norm)(y, z)
        return make_output((project_by_name(self, "out_proj", heads.to(x.dtype)), weights, None))
