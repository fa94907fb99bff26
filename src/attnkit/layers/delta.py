r"""Gated DeltaNet, the linear-attention layer of Qwen3-Next and Qwen3.5 (three of every four layers), with its
constant-size cache.

    [q ; k ; v ; z] = x W_qkvz,   [b ; a] = x W_ba               (heads grouped per key head, as Qwen3-Next)
    [q ; k ; v] = silu(causal_conv1d([q ; k ; v]))               (a depthwise convolution over the last 4 tokens)
    beta = sigmoid(b),   g = -exp(A_log) softplus(a + dt_bias)   (a step and a log-decay per value head)
    o = gated_delta_rule(l2norm(q), l2norm(k), v, g, beta)       (attnkit.functional.linear)
    out = W_o [RMSNorm(o) * silu(z)]                              (a gated RMSNorm per head)

Parameters carry transformers' names (``in_proj_qkvz``, ``in_proj_ba``, ``conv1d``, ``dt_bias``, ``A_log``,
``norm.weight``, ``out_proj``), so a checkpoint's tensors load as they are. The cache
(:class:`LinearStateCache`) holds, per sequence, the convolution's last inputs and the recurrent state:
(kernel - 1) x conv channels + H x K x V numbers, whatever the length decoded.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional.attention import AttentionOutput, make_output
from ..functional.checks import check_int, check_rank
from ..functional.linear import gated_delta_rule, gated_linear_attention, implicit_attention
from ..functional.linear.kernels import check_backend
from ..functional.precision import accumulation_dtype
from .calls import called, project_by_name

__all__ = ["GatedDeltaNet", "KimiDeltaAttention", "LightningAttention", "KimiForgetGate", "GatedRMSNorm",
           "LinearStateCache", "causal_convolution"]


class GatedRMSNorm(nn.Module):
    """RMSNorm over the last dim, then times act(gate), in float32: Qwen3-Next's ``Qwen3NextRMSNormGated``
    (``activation="silu"``, the weight applied in the input's dtype) or Kimi Linear's ``KimiLinearRMSNormGated``
    (``"sigmoid"``, the weight applied in float32)."""

    def __init__(self, dim: int, eps: float = 1e-6, *, activation: str = "silu"):
        super().__init__()
        if activation not in ("silu", "sigmoid"):
            raise ValueError(f"activation must be 'silu' (Qwen3-Next) or 'sigmoid' (Kimi Linear), got {activation!r}")
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.activation = eps, activation

    def forward(self, x: Tensor, gate: Tensor) -> Tensor:
        dtype = x.dtype
        acc = accumulation_dtype(dtype)
        h = x.to(acc)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.activation == "silu":
            return (self.weight * h.to(dtype) * F.silu(gate.to(acc))).to(dtype)
        return (self.weight.to(acc) * h * torch.sigmoid(gate.to(acc))).to(dtype)


def causal_convolution(mixed: Tensor, weight: Tensor, cache: LinearStateCache | None, bias: Tensor | None = None) -> Tensor:
    """silu(a causal depthwise convolution) of (B, channels, L) with ``weight`` (channels, 1, kernel) and ``bias``
    (channels,) or None, continuing the cache's last (kernel - 1) inputs (zeros before the first token, as the
    convolution pads) and keeping the new ones in it."""
    kernel = weight.shape[-1] - 1
    if mixed.shape[-1] == 0:  # no token: nothing to convolve, the cache's last inputs as they were
        return F.silu(mixed)
    if cache is not None and cache.conv is not None:
        full = torch.cat([cache.conv, mixed], dim=-1)
    else:
        full = F.pad(mixed, (kernel, 0))
    if cache is not None:
        cache.conv = full[..., full.shape[-1] - kernel:].detach()
    if mixed.shape[-1] == 1:  # a decoding step: its one output as the taps' products summed (F.conv1d's depthwise
        # kernel costs several times more for one position)
        acc = accumulation_dtype(full.dtype)  # (a half type's products summed in float32, as the convolution's)
        taps = full.to(acc) * weight.reshape(weight.shape[0], -1).to(acc)  # (B, channels, kernel)
        summed = taps.sum(dim=-1, keepdim=True)
        if bias is not None:
            summed = summed + bias.to(acc)[:, None]
        return F.silu(summed.to(full.dtype))
    return F.silu(F.conv1d(full, weight, bias, groups=weight.shape[0]))


class LinearStateCache:
    """The cache of a linear-attention layer: for each sequence the convolution's last (kernel - 1) inputs and
    the recurrent state (H, K, V) after the tokens seen so far. Constant in size whatever the length decoded;
    ``position`` counts the tokens taken in. ``reorder`` follows a beam search; ``reset`` empties it."""

    def __init__(self) -> None:
        self.conv: Tensor | None = None  # (B, channels, kernel - 1)
        self.state: Tensor | None = None  # (B, H, K, V), float32 (float64 for a float64 layer)
        self.position = 0

    def reset(self) -> None:
        self.conv = self.state = None
        self.position = 0

    def reorder(self, index: Tensor) -> None:
        """Keep the rows ``index`` (B',) of the batch, in that order (a beam search's choice)."""
        if self.conv is not None:
            self.conv = self.conv.index_select(0, index)
        if self.state is not None:
            self.state = self.state.index_select(0, index)

    def numbers(self) -> int:
        """Numbers held per sequence (not per token: it does not grow)."""
        return sum(x[0].numel() for x in (self.conv, self.state) if x is not None and x.shape[0])

    def attended_length(self, new: int) -> int:
        """The columns of a model's attention mask a call of ``new`` tokens reads: its own (the state stands for
        the rest)."""
        return new

    def check_batch(self, B: int) -> None:
        if self.state is not None and self.state.shape[0] != B:
            raise ValueError(f"cache holds {self.state.shape[0]} sequences, the call has B={B}: a cache serves the "
                             "batch it was filled for (reorder it for a beam search)")


def _checked_input(x: Tensor, d_model: int, key_mask: Tensor | None, cache: LinearStateCache | None) -> Tensor:
    """x (B, L, D) checked with the call's key_mask (B, L) and cache; a padded token's input made zeros (as
    transformers makes it: with no update and no decay in the rule, it leaves the state untouched), whatever it
    held."""
    check_rank("x", x, 3, "(B, L, D)")
    if x.shape[-1] != d_model:
        raise ValueError(f"x must have last dim d_model={d_model}, got shape {tuple(x.shape)}")
    B, L, _ = x.shape
    if cache is not None:
        if not isinstance(cache, LinearStateCache):
            raise TypeError(f"cache must be a LinearStateCache, got {type(cache).__name__}")
        cache.check_batch(B)
    if key_mask is None:
        return x
    if not isinstance(key_mask, Tensor) or tuple(key_mask.shape) != (B, L) or key_mask.is_floating_point():
        got = (key_mask.dtype, tuple(key_mask.shape)) if isinstance(key_mask, Tensor) else type(key_mask).__name__
        raise ValueError(f"key_mask must be boolean (or 0/1) of shape (B, L) = {(B, L)} (the call's own tokens), got {got}")
    return torch.where(key_mask.bool()[..., None], x, 0.0)  # selected: a padded token's NaN reaches no real one


def _rule_through_cache(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cache: LinearStateCache | None,
                        key_mask: Tensor | None, chunk_size: int, need_weights: bool,
                        backend: str) -> tuple[Tensor, Tensor | None]:
    """The gated delta rule (q and k normalised) over the call's tokens from the cache's state, the new state kept
    in the cache; and the call's implicit attention matrix when asked: (output (B, H, L, V), weights or None)."""
    state = None if cache is None else cache.state
    # g <= 0 and beta in [0, 1] by construction (-exp(.) softplus(.), a sigmoid): no look at their values
    result = gated_delta_rule(q, k, v, g, beta, initial_state=state, output_final_state=cache is not None,
                              chunk_size=chunk_size, use_qk_l2norm=True, key_mask=key_mask, check_values=False,
                              backend=backend)
    if cache is not None:
        cache.state = result.final_state
        cache.position += v.shape[2]
    weights = implicit_attention(q, k, g, beta, use_qk_l2norm=True, key_mask=key_mask) if need_weights else None
    return result.output, weights


class GatedDeltaNet(nn.Module):
    """Qwen3-Next's Gated DeltaNet layer (module docstring): (B, L, D) -> :class:`AttentionOutput` with the output
    (B, L, D) and, with ``need_weights``, the implicit attention matrix (B, H, L, L) of the call's own tokens.

    Args:
        d_model: D. num_k_heads, num_v_heads: heads of q/k and of v (num_v_heads a multiple; Qwen3-Next 16 and 32).
        head_k_dim, head_v_dim: their widths (128 and 128).
        conv_kernel: the causal convolution's width (4). norm_eps: the gated RMSNorm's epsilon.
        chunk_size: the chunked form's chunk (64; 1 is the recurrence).
        backend: whose kernel computes the rule: ``"auto"`` (flash-linear-attention's for float16 and bfloat16 on
            CUDA where fla-core is installed), ``"torch"`` or ``"fla"`` (:mod:`attnkit.functional.linear.kernels`);
            an attribute, settable on a loaded model's layers.
    """

    def __init__(self, d_model: int, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int, *,
                 conv_kernel: int = 4, norm_eps: float = 1e-6, chunk_size: int = 64, backend: str = "auto"):
        super().__init__()
        self.backend = check_backend(backend)
        for name, value in (("d_model", d_model), ("num_k_heads", num_k_heads), ("num_v_heads", num_v_heads),
                            ("head_k_dim", head_k_dim), ("head_v_dim", head_v_dim), ("conv_kernel", conv_kernel),
                            ("chunk_size", chunk_size)):
            check_int(name, value, 1)
        if num_v_heads % num_k_heads:
            raise ValueError(f"num_v_heads={num_v_heads} must be a multiple of num_k_heads={num_k_heads}")
        self.d_model, self.num_k_heads, self.num_v_heads = d_model, num_k_heads, num_v_heads
        self.head_k_dim, self.head_v_dim, self.conv_kernel, self.chunk_size = head_k_dim, head_v_dim, conv_kernel, chunk_size
        self.key_dim, self.value_dim = num_k_heads * head_k_dim, num_v_heads * head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.in_proj_qkvz = nn.Linear(d_model, 2 * self.key_dim + 2 * self.value_dim, bias=False)
        self.in_proj_ba = nn.Linear(d_model, 2 * num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, conv_kernel, groups=self.conv_dim, bias=False,
                                padding=conv_kernel - 1)
        self.dt_bias = nn.Parameter(torch.ones(num_v_heads))
        self.A_log = nn.Parameter(torch.log(torch.empty(num_v_heads).uniform_(0.01, 16)))
        self.norm = GatedRMSNorm(head_v_dim, eps=norm_eps)
        self.out_proj = nn.Linear(self.value_dim, d_model, bias=False)

    def _split(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """q, k (B, L, Hk*K), v, z (B, L, Hv*V), b, a (B, L, Hv) from the projections, whose outputs are grouped
        per key head ([q k v z] of key head 0, then of key head 1, ...), as Qwen3-Next stores them."""
        B, L, _ = x.shape
        Hk, group = self.num_k_heads, self.num_v_heads // self.num_k_heads
        Kd, Vd = self.head_k_dim, self.head_v_dim
        qkvz = project_by_name(self, "in_proj_qkvz", x).view(B, L, Hk, 2 * Kd + 2 * group * Vd)
        q, k, v, z = qkvz.split([Kd, Kd, group * Vd, group * Vd], dim=-1)
        ba = project_by_name(self, "in_proj_ba", x).view(B, L, Hk, 2 * group)
        b, a = ba.split([group, group], dim=-1)
        Hv = self.num_v_heads  # the sizes spelled out: a call of no token has no -1 to infer
        return (q.reshape(B, L, Hk * Kd), k.reshape(B, L, Hk * Kd), v.reshape(B, L, Hv * Vd), z.reshape(B, L, Hv, Vd),
                b.reshape(B, L, Hv), a.reshape(B, L, Hv))

    def forward(self, x: Tensor, *, key_mask: Tensor | None = None, cache: LinearStateCache | None = None,
                need_weights: bool = False) -> AttentionOutput:
        """x (B, L, D); ``key_mask`` (B, L) True at real tokens (left padding: a padded token's input counts as
        zeros and it leaves the state untouched); ``cache`` carries the convolution and the state across calls."""
        x = _checked_input(x, self.d_model, key_mask, cache)
        B, L, _ = x.shape
        q, k, v, z, b, a = self._split(x)
        mixed = causal_convolution(torch.cat([q, k, v], dim=-1).transpose(1, 2), self.conv1d.weight, cache).transpose(1, 2)
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(B, L, self.num_k_heads, self.head_k_dim).transpose(1, 2)
        k = k.reshape(B, L, self.num_k_heads, self.head_k_dim).transpose(1, 2)
        v = v.reshape(B, L, self.num_v_heads, self.head_v_dim).transpose(1, 2)
        beta = b.sigmoid().transpose(1, 2)  # (B, Hv, L)
        acc = accumulation_dtype(x.dtype)
        g = (-self.A_log.to(acc).exp() * F.softplus(a.to(acc) + self.dt_bias.to(acc))).transpose(1, 2)
        output, weights = _rule_through_cache(q, k, v, g, beta, cache, key_mask, self.chunk_size, need_weights,
                                              self.backend)
        heads = called(self._modules["norm"])(output.transpose(1, 2), z)  # (B, L, Hv, V)
        return make_output((project_by_name(self, "out_proj", heads.reshape(B, L, self.value_dim)), weights, None))


class KimiForgetGate(nn.Module):
    """Kimi Delta Attention's per-channel log-decay: g = -exp(A_log) softplus(f_b(f_a(x)) + dt_bias), one rate per
    head (``A_log``) and one bias per channel, as transformers' ``KimiLinearForgetGate`` (its parameter names)."""

    def __init__(self, d_model: int, num_heads: int, head_dim: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        self.f_a_proj = nn.Linear(d_model, head_dim, bias=False)
        self.f_b_proj = nn.Linear(head_dim, num_heads * head_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.zeros(num_heads * head_dim))
        self.A_log = nn.Parameter(torch.zeros(1, 1, num_heads, 1))

    def forward(self, x: Tensor) -> Tensor:
        """(B, L, D) -> g (B, H, L, K), <= 0, in float32 (float64 for a float64 layer)."""
        acc = accumulation_dtype(x.dtype)
        B, L, _ = x.shape
        low = project_by_name(self, "f_a_proj", x)
        raw = (project_by_name(self, "f_b_proj", low).to(acc) + self.dt_bias.to(acc)).view(B, L, self.num_heads, self.head_dim)
        return (-self.A_log.to(acc).exp() * F.softplus(raw)).transpose(1, 2)


class KimiDeltaAttention(nn.Module):
    """Kimi Linear's Kimi Delta Attention layer: the gated delta rule with a decay per key channel.

        q, k, v = silu(causal_conv1d([x W_q ; x W_k ; x W_v]))     (one depthwise convolution of 4 over the three)
        g = forget_gate(x) (per channel),  beta = sigmoid(x W_b)
        o = gated_delta_rule(l2norm(q), l2norm(k), v, g, beta),   out = W_o [RMSNorm(o) * sigmoid(W_gb W_ga x)]

    Parameters carry transformers' names (``q_proj``, ``k_proj``, ``v_proj``, ``conv1d``, ``forget_gate.*``,
    ``b_proj``, ``g_a_proj``, ``g_b_proj``, ``o_norm``, ``o_proj``). (B, L, D) -> :class:`AttentionOutput`, with
    the implicit attention matrix (B, H, L, L) when asked; ``cache`` a :class:`LinearStateCache`. ``chunk_size`` and
    ``backend`` as :class:`GatedDeltaNet`'s."""

    def __init__(self, d_model: int, num_heads: int, head_dim: int, *, conv_kernel: int = 4, norm_eps: float = 1e-6,
                 chunk_size: int = 64, backend: str = "auto"):
        super().__init__()
        self.backend = check_backend(backend)
        for name, value in (("d_model", d_model), ("num_heads", num_heads), ("head_dim", head_dim),
                            ("conv_kernel", conv_kernel), ("chunk_size", chunk_size)):
            check_int(name, value, 1)
        self.d_model, self.num_heads, self.head_dim, self.chunk_size = d_model, num_heads, head_dim, chunk_size
        width = num_heads * head_dim
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d_model, width, bias=False) for _ in range(3))
        self.conv1d = nn.Conv1d(3 * width, 3 * width, conv_kernel, groups=3 * width, bias=False, padding=conv_kernel - 1)
        self.forget_gate = KimiForgetGate(d_model, num_heads, head_dim)
        self.b_proj = nn.Linear(d_model, num_heads, bias=False)
        self.g_a_proj = nn.Linear(d_model, head_dim, bias=False)
        self.g_b_proj = nn.Linear(head_dim, width, bias=False)
        self.o_norm = GatedRMSNorm(head_dim, eps=norm_eps, activation="sigmoid")
        self.o_proj = nn.Linear(width, d_model, bias=False)

    def forward(self, x: Tensor, *, key_mask: Tensor | None = None, cache: LinearStateCache | None = None,
                need_weights: bool = False) -> AttentionOutput:
        """As :meth:`GatedDeltaNet.forward`."""
        x = _checked_input(x, self.d_model, key_mask, cache)
        B, L, _ = x.shape
        H, E = self.num_heads, self.head_dim
        mixed = torch.cat([project_by_name(self, name, x) for name in ("q_proj", "k_proj", "v_proj")], dim=-1).transpose(1, 2)
        q, k, v = causal_convolution(mixed, self.conv1d.weight, cache).transpose(1, 2).split(H * E, dim=-1)
        q, k, v = (t.reshape(B, L, H, E).transpose(1, 2) for t in (q, k, v))
        g = called(self._modules["forget_gate"])(x)
        beta = torch.sigmoid(project_by_name(self, "b_proj", x)).transpose(1, 2)
        output, weights = _rule_through_cache(q, k, v, g, beta, cache, key_mask, self.chunk_size, need_weights,
                                              self.backend)
        gate = project_by_name(self, "g_b_proj", project_by_name(self, "g_a_proj", x)).view(B, L, H, E)
        heads = called(self._modules["o_norm"])(output.transpose(1, 2), gate)
        return make_output((project_by_name(self, "o_proj", heads.reshape(B, L, H * E)), weights, None))


class LightningAttention(nn.Module):
    """MiniMax-01's lightning attention layer: gated linear attention with a constant decay per head, no scale.

        [q ; k ; v] = silu(x W_qkv),   S_t = exp(-s_h) S_{t-1} + k_t v_t^T,   o_t = S_t^T q_t
        out = W_o [sigmoid(x W_gate) * RMSNorm(o)]

    The rates s_h = 2^(-8 (h + 1) / H) (1 - layer / (layers - 1 + 1e-5) + 1e-5) fall with depth, as MiniMax
    sets them. Parameters and buffers carry transformers' names (``qkv_proj``, ``output_gate``, ``norm``,
    ``out_proj``; ``slope_rate`` and the block decays its state dict holds), so its tensors load as they are.
    (B, L, D) -> :class:`AttentionOutput` with the implicit attention matrix when asked; ``cache`` a
    :class:`LinearStateCache` (the state only: no convolution). ``backend`` as :class:`GatedDeltaNet`'s."""

    slope_rate: Tensor

    def __init__(self, d_model: int, num_heads: int, head_dim: int, *, layer_idx: int, num_layers: int,
                 block_size: int = 256, norm_eps: float = 1e-6, backend: str = "auto"):
        super().__init__()
        self.backend = check_backend(backend)
        for name, value in (("d_model", d_model), ("num_heads", num_heads), ("head_dim", head_dim),
                            ("num_layers", num_layers), ("block_size", block_size)):
            check_int(name, value, 1)
        check_int("layer_idx", layer_idx, 0)
        self.d_model, self.num_heads, self.head_dim, self.block_size = d_model, num_heads, head_dim, block_size
        width = num_heads * head_dim
        self.qkv_proj = nn.Linear(d_model, 3 * width, bias=False)
        self.output_gate = nn.Linear(d_model, width, bias=False)
        self.norm = nn.RMSNorm(width, eps=norm_eps)
        self.out_proj = nn.Linear(width, d_model, bias=False)
        factor = 1 - layer_idx / (num_layers - 1 + 1e-5) + 1e-5
        slope = (1 / 2 ** (8 / num_heads)) ** (torch.arange(num_heads) + 1) * factor
        rates = slope[:, None, None]
        self.register_buffer("slope_rate", rates)
        # transformers' block decays, kept only so that its state dict loads strictly (the rule needs the rates alone)
        steps = torch.arange(block_size) + 1
        self.register_buffer("query_decay", torch.exp(-rates * steps[:, None]))
        self.register_buffer("key_decay", torch.exp(-rates * (block_size - steps[:, None])))
        gaps = rates * (steps[:, None] - steps[None, :])[None, None]
        self.register_buffer("diagonal_decay", torch.exp(torch.where(gaps >= 0, -gaps, float("-inf"))))

    def forward(self, x: Tensor, *, key_mask: Tensor | None = None, cache: LinearStateCache | None = None,
                need_weights: bool = False) -> AttentionOutput:
        """As :meth:`GatedDeltaNet.forward`."""
        masked = _checked_input(x, self.d_model, key_mask, cache)  # a padded token: zeros, so silu(0 W) = 0
        B, L, _ = x.shape
        H, E = self.num_heads, self.head_dim
        qkv = F.silu(project_by_name(self, "qkv_proj", masked))  # a padded token has no key, value or query
        q, k, v = qkv.view(B, L, H, 3 * E).split(E, dim=-1)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        acc = accumulation_dtype(x.dtype)
        g = (-self.slope_rate.to(acc)).view(1, H, 1).expand(B, H, L)
        state = None if cache is None else cache.state
        result = gated_linear_attention(q, k, v, g, scale=1.0, initial_state=state, output_final_state=cache is not None,
                                        chunk_size=min(self.block_size, 64), key_mask=key_mask, backend=self.backend)
        if cache is not None:
            cache.state = result.final_state
            cache.position += L
        weights = implicit_attention(q, k, g, None, scale=1.0, key_mask=key_mask) if need_weights else None
        heads = called(self._modules["norm"])(result.output.transpose(1, 2).reshape(B, L, H * E))
        gated = torch.sigmoid(project_by_name(self, "output_gate", x)) * heads
        return make_output((project_by_name(self, "out_proj", gated), weights, None))
