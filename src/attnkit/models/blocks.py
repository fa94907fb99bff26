"""Pieces the model families share: feed-forward networks, norms, parameter counting, each layer's key mask.

    FFN(x) = act(x W_1 + b_1) W_2 + b_2                 (Vaswani et al. 2017, eq. 2; BERT, GPT-2)
    GLU(x) = down(act(gate(x)) * up(x))                  (Shazeer 2020; SwiGLU in Llama)
    MoE(x) = sum over x's chosen experts e of w_e SwiGLU_e(x)   (DeepSeek-V3, Qwen3-Next: routed_experts)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional.precision import accumulation_dtype
from ..layers.calls import called, hookless, project_by_name

__all__ = ["ACTIVATIONS", "Dropout", "KeepsFloat32", "FeedForward", "GatedFeedForward", "Experts", "softmax_top_k",
           "sigmoid_group_top_k", "routed_experts",
           "make_norm", "normalised", "count_parameters", "layer_key_masks"]

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": torch.relu,
    "gelu": F.gelu,  # exact (erf) GELU: BERT
    "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),  # GPT-2's "gelu_new"
    "silu": F.silu,  # Swish: Llama's gate
    "relu2": lambda x: torch.relu(x).square(),  # squared ReLU (So et al. 2021): Nemotron-H's MLPs and experts
}


class Dropout(nn.Dropout):
    """``nn.Dropout`` that costs nothing where it does nothing: in eval mode, or with p = 0, a call returns its
    input without entering the module machinery (``nn.Module.__call__`` and ``F.dropout`` took about 3 us a
    call, nine calls a decoding step of a 4-layer DecoderLM: benchmarks/overhead.py). Forward hooks on it
    therefore run only while it drops."""

    def __call__(self, x: Tensor) -> Tensor:
        if self.training and self.p:
            return super().__call__(x)
        return x


def _activation(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]


class FeedForward(nn.Module):
    """FFN(x) = act(x W_1 + b_1) W_2 + b_2 (Vaswani et al. eq. 2 with ReLU; GELU in BERT and GPT-2)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, *, activation: str = "relu", bias: bool = True):
        super().__init__()
        self.activation = _activation(activation)
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        # the projections called as project() calls them: F.linear where the module call would add nothing
        return project_by_name(self, "linear2", self.dropout(self.activation(project_by_name(self, "linear1", x))))


class GatedFeedForward(nn.Module):
    """Gated linear unit (Shazeer 2020): down(act(gate(x)) * up(x)); SwiGLU (silu) as in Llama,
    GeGLU with a GELU."""

    def __init__(self, d_model: int, d_ff: int, *, bias: bool = False, activation: str = "silu"):
        super().__init__()
        self.activation = _activation(activation)
        self.gate_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        # the projections called as project() calls them: three module calls fewer a layer (about 2 us each)
        gate, up = project_by_name(self, "gate_proj", x), project_by_name(self, "up_proj", x)
        return project_by_name(self, "down_proj", self.activation(gate) * up)


def routed_experts(x: Tensor, gate_up_proj: Tensor, down_proj: Tensor, experts: Tensor, weights: Tensor, *,
                   activation: str | None = None) -> Tensor:
    """Each token's chosen SwiGLU experts, weighted and summed: x (N, D), transformers' fused expert weights
    ``gate_up_proj`` (E, 2F, D) and ``down_proj`` (E, D, F), ``experts`` (N, k) the chosen and ``weights`` (N, k)
    theirs; each expert runs once, on the tokens that chose it. A product with float32 weights is rounded to
    x's dtype once, when added. With ``activation`` (a name of :data:`ACTIVATIONS`) the experts are not gated:
    ``gate_up_proj`` is their up projection (E, F, D) and an expert is down(act(up(x))) (Nemotron-H's)."""
    act = None if activation is None else _activation(activation)
    out = torch.zeros_like(x)
    if x.shape[0] == 1:  # one token (a decoding step): its experts in turn, without the token lists
        chosen = experts[0].tolist()
        for expert in sorted(set(chosen)):  # the general path's order and additions (bit for bit where, as a
            # top-k router chooses them, the experts differ)
            y = _expert(x, gate_up_proj[expert], down_proj[expert], act)
            for position in (i for i, e in enumerate(chosen) if e == expert):
                out.add_((y * weights[:, position, None]).to(out.dtype))
        return out
    for expert in experts.unique().tolist():
        token, slot = torch.where(experts == expert)
        y = _expert(x[token], gate_up_proj[expert], down_proj[expert], act)
        out.index_add_(0, token, (y * weights[token, slot, None]).to(out.dtype))
    return out


def _expert(x: Tensor, gate_up_proj: Tensor, down_proj: Tensor, act=None) -> Tensor:
    """One SwiGLU expert on its tokens x (n, D): ``gate_up_proj`` (2F, D), ``down_proj`` (D, F); with ``act``, an
    ungated one: down(act(x up^T)), ``gate_up_proj`` the up projection (F, D)."""
    if act is not None:
        return F.linear(act(F.linear(x, gate_up_proj)), down_proj)
    gate, up = F.linear(x, gate_up_proj).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, down_proj)


class Experts(nn.Module):
    """A mixture's SwiGLU experts as transformers stores them, fused: ``gate_up_proj`` (E, 2F, D) and ``down_proj``
    (E, D, F); ``forward(x (N, D), experts (N, k), weights (N, k))`` is :func:`routed_experts`."""

    def __init__(self, num_experts: int, d_model: int, d_ff: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * d_ff, d_model).normal_(0, 0.02))
        self.down_proj = nn.Parameter(torch.empty(num_experts, d_model, d_ff).normal_(0, 0.02))

    def forward(self, x: Tensor, experts: Tensor, weights: Tensor) -> Tensor:
        return routed_experts(x, self.gate_up_proj, self.down_proj, experts, weights)


def softmax_top_k(logits: Tensor, k: int, normalise: bool) -> tuple[Tensor, Tensor]:
    """A softmax router's choice (Mixtral, Qwen3-Next, MiniMax): (experts (N, k), weights (N, k)) from router
    logits (N, E), the softmax in float32 (float64 for a float64 model), the top-k probabilities renormalised to
    sum 1 where ``normalise``."""
    probs = torch.softmax(logits, dim=-1, dtype=accumulation_dtype(logits.dtype))
    top, chosen = probs.topk(k, dim=-1)
    if normalise:
        top = top / top.sum(dim=-1, keepdim=True)
    return chosen, top


class KeepsFloat32(nn.Module):
    """A module whose tensors named in ``FLOAT32`` stay float32 when the model goes to float16 or bfloat16, as
    transformers keeps a router's weight and score bias (``_keep_in_fp32_modules_strict``): routing reads them in
    float32, and a bias rounded to bfloat16 would choose other experts than the checkpoint's."""

    FLOAT32: tuple[str, ...] = ()

    def _apply(self, fn, recurse=True):
        before = {name: getattr(self, name).detach() for name in self.FLOAT32}  # the values, not rounded
        super()._apply(fn, recurse)
        for name, value in before.items():
            now = getattr(self, name)
            if now.dtype in (torch.float16, torch.bfloat16):
                exact = value.to(device=now.device, dtype=torch.float32)
                if isinstance(now, nn.Parameter):
                    now.data = exact  # the same Parameter object: an optimizer holding it still does
                else:
                    setattr(self, name, exact)
        return self


def sigmoid_group_top_k(logits: Tensor, score_bias: Tensor, k: int, *, groups: int = 1, groups_per_token: int = 1,
                        normalise: bool = True, scaling: float = 1.0) -> tuple[Tensor, Tensor]:
    """DeepSeek-V3's router (also Nemotron-H's): (experts (N, k), weights (N, k)) from router logits (N, E) in the
    routing dtype. Scores are sigmoid(logits); the choice adds ``score_bias`` (E,) (``e_score_correction_bias``),
    keeps the ``groups_per_token`` best of ``groups`` expert groups (a group's worth: its two best choices summed)
    and takes the top k there; the weights are the chosen experts' scores (without the bias), renormalised to sum 1
    where ``normalise``, times ``scaling`` (``routed_scaling_factor``)."""
    scores = torch.sigmoid(logits)
    choice = scores + score_bias.to(scores.dtype)
    E = choice.shape[-1]
    grouped = choice.view(-1, groups, E // groups)
    group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(dim=-1)  # (N, groups)
    kept = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(groups_per_token, dim=-1).indices, 1.0)
    choice = choice.masked_fill(~kept.bool().repeat_interleave(E // groups, dim=1), float("-inf"))
    experts = choice.topk(k, dim=-1).indices
    weights = scores.gather(1, experts)
    if normalise:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return experts, weights * scaling


def make_norm(kind: str, d_model: int, eps: float = 1e-5) -> nn.Module:
    """``"layernorm"`` (Ba et al. 2016; Vaswani, BERT, GPT-2) or ``"rmsnorm"`` (Zhang & Sennrich 2019; Llama)."""
    if kind == "layernorm":
        return nn.LayerNorm(d_model, eps=eps)
    if kind == "rmsnorm":
        return nn.RMSNorm(d_model, eps=eps)
    raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {kind!r}")


def normalised(norm: nn.Module | None, x: Tensor) -> Tensor:
    """``norm(x)``. An ``nn.RMSNorm`` or ``nn.LayerNorm`` whose call would add nothing
    (:func:`attnkit.layers.calls.hookless`) runs its functional form on its own parameters, without
    ``nn.Module.__call__`` (about two microseconds; nine norms a decoding step of a 4-layer model); another norm
    (a subclass, a replacement, the hybrids' own) runs as :func:`~attnkit.layers.calls.called` runs it: its
    ``forward``, or the module where it has hooks or a compiled call. (``None`` only to take an entry of
    ``nn.Module._modules`` as typed.)"""
    assert norm is not None
    kind = type(norm)
    if (kind is nn.RMSNorm or kind is nn.LayerNorm) and hookless(norm):
        parameters = norm._parameters  # (a parameter deleted from it, and perhaps set as an attribute: the module's call)
        if kind is nn.RMSNorm and "weight" in parameters:
            rms = cast(nn.RMSNorm, norm)
            return F.rms_norm(x, rms.normalized_shape, parameters["weight"], rms.eps)
        if kind is nn.LayerNorm and "weight" in parameters and "bias" in parameters:
            layer = cast(nn.LayerNorm, norm)
            return F.layer_norm(x, layer.normalized_shape, parameters["weight"], parameters["bias"], layer.eps)
    return called(norm)(x)


def count_parameters(module: nn.Module) -> int:
    """Number of distinct parameters (tied weights count once)."""
    return sum(p.numel() for p in module.parameters())


def layer_key_masks(attention_mask: Tensor | None, B: int, L: int, caches) -> list[Tensor] | None:
    """Each layer's key mask (B, S_i) from a model's ``attention_mask`` (B, W), True (or 1) at real tokens, for a
    call of L new tokens through ``caches`` (one per layer, or None): layer i reads the last S_i columns, S_i =
    ``caches[i].attended_length(L)`` (what a growing cache holds and the new tokens; a rolling cache's window and
    the new tokens; a linear layer's own L; a fixed-size cache's capacity; L for a layer with no cache, None), so
    that layers whose caches hold different lengths (sliding windows on some layers, linear layers beside softmax
    ones) each get theirs.

    W is the tokens so far, cached and new (as transformers' ``attention_mask``), or any width from the longest
    S_i on; without caches, L. Layers of one S share one mask (what a layer keeps beside it serves them all). None
    without a mask; a mask of another shape is refused by name."""
    if attention_mask is None:
        return None
    lengths = [L] if caches is None else [L if cache is None else cache.attended_length(L) for cache in caches]
    least = max(lengths)
    widest = least if caches is None else max([least, *(getattr(cache, "position", 0) + L for cache in caches)])
    if attention_mask.dim() != 2 or attention_mask.shape[0] != B or not least <= attention_mask.shape[1] <= widest:
        span = f"S = {least}" if least == widest else f"{least} <= S <= {widest}"
        raise ValueError(f"attention_mask must have shape (B, S) with B = {B}, {span} (the tokens so far: cached and "
                         f"new), got {tuple(attention_mask.shape)}")
    key_mask = attention_mask.bool()
    if caches is None:  # (sizes may be symbols under torch.export: none is hashed or sliced)
        return [key_mask]
    W = key_mask.shape[1]
    by_length: dict[int, Tensor] = {}
    masks = []
    for S in lengths:
        if S not in by_length:
            by_length[S] = key_mask if S == W else key_mask[:, W - S:]
        masks.append(by_length[S])
    return masks
