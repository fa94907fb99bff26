"""NVIDIA's Nemotron-H as an attnkit decoder: a stack of single-purpose layers (``layer_types``), each one mixer after
an RMSNorm with a residual around it: Mamba-2 (``linear_attention``), GQA softmax attention without position
embedding (``full_attention``), a squared-ReLU MLP (``mlp``) or a mixture of squared-ReLU experts (``moe``).

    x = embed(ids);   for each layer: x = x + mixer(RMSNorm(x));   logits = lm_head(RMSNorm(x))
        moe: sigmoid router with a score bias and expert groups (DeepSeek-V3's), top-k experts down(relu(up x)^2),
             optionally in a latent width (fc1_latent_proj, fc2_latent_proj), + a shared expert

Its Mamba-2 steps are clamped below at ``time_step_min`` (transformers' ``NemotronHMamba2Mixer`` does so, whatever
``time_step_limit`` says). Module names follow transformers' (``embeddings``, ``layers.i.norm``, ``layers.i.mixer``
with the Mamba-2, attention, MLP or MoE names under it; attnkit's ``norm`` for ``norm_f`` and ``out_proj`` for an
attention's ``o_proj``), so a checkpoint's tensors find their places by name (:func:`load_checkpoint_folder`, reached
through :func:`attnkit.models.pretrained.load_hf_folder`); experts saved one by one are stacked as transformers
stacks them.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..functional.precision import accumulation_dtype
from ..layers import Mamba2, MultiHeadAttention
from ..layers.calls import called, project_by_name
from ..layers.mamba2 import SSD_CHUNK
from .blocks import ACTIVATIONS, KeepsFloat32, normalised, routed_experts, sigmoid_group_top_k
from .config_values import COUNT, FLAG, NAME, NAMES, NON_NEGATIVE, NUMBER, SIZE, STEP_LIMIT, nullable
from .hf_config import UnsupportedConfigError
from .hybrid import FEED_FORWARD_ONLY, HARMLESS, LINEAR, HybridLM, checked_keys, json_float, mix
from .weights import load_native_folder

__all__ = ["NemotronHConfig", "NemotronHLM", "nemotron_h_config_from_hf", "load_checkpoint_folder"]

KINDS = (LINEAR, "full_attention", "mlp", "moe")
_PATTERN = {"M": LINEAR, "*": "full_attention", "-": "mlp", "E": "moe"}  # (hybrid_override_pattern's letters)


@dataclass(frozen=True)
class NemotronHConfig:
    """The sizes of a Nemotron-H model (transformers' ``NemotronHConfig`` keys, attnkit's names)."""

    vocab_size: int
    d_model: int
    layer_types: tuple[str, ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    attention_bias: bool
    mamba_heads: int
    mamba_head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    conv_bias: bool
    proj_bias: bool
    chunk_size: int
    dt_limit: tuple[float, float]
    d_ff: int
    mlp_bias: bool = False
    num_experts: int = 0
    experts_per_token: int = 1
    moe_d_ff: int = 0
    shared_d_ff: int = 0
    latent_size: int | None = None
    expert_groups: int = 1
    groups_per_token: int = 1
    norm_topk_prob: bool = True
    routed_scaling: float = 1.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    max_len: int = 4096


class SquaredReLUMLP(nn.Module):
    """Nemotron-H's MLP: down(relu(up(x))^2)."""

    def __init__(self, d_model: int, d_ff: int, bias: bool = False):
        super().__init__()
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return project_by_name(self, "down_proj", ACTIVATIONS["relu2"](project_by_name(self, "up_proj", x)))


class GroupRouter(KeepsFloat32):
    """The router (``gate``): ``weight`` (E, D) and ``e_score_correction_bias`` (E,), routing in float32 (float64
    for float64) by :func:`~attnkit.models.blocks.sigmoid_group_top_k`; both kept float32 in a half-type model, as
    transformers keeps them."""

    e_score_correction_bias: Tensor
    FLOAT32 = ("weight", "e_score_correction_bias")

    def __init__(self, c: NemotronHConfig):
        super().__init__()
        self.c = c
        self.weight = nn.Parameter(torch.empty(c.num_experts, c.d_model).normal_(0, 0.02))
        self.register_buffer("e_score_correction_bias", torch.zeros(c.num_experts))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        c, acc = self.c, accumulation_dtype(x.dtype)
        logits = torch.nn.functional.linear(x.to(acc), self.weight.to(acc))
        return sigmoid_group_top_k(logits, self.e_score_correction_bias, c.experts_per_token, groups=c.expert_groups,
                                   groups_per_token=c.groups_per_token, normalise=c.norm_topk_prob,
                                   scaling=c.routed_scaling)


class SquaredReLUExperts(nn.Module):
    """The routed experts, stacked: ``up_proj`` (E, F, W) and ``down_proj`` (E, W, F), W the latent width (or D)."""

    def __init__(self, num_experts: int, width: int, d_ff: int):
        super().__init__()
        self.up_proj = nn.Parameter(torch.empty(num_experts, d_ff, width).normal_(0, 0.02))
        self.down_proj = nn.Parameter(torch.empty(num_experts, width, d_ff).normal_(0, 0.02))

    def forward(self, x: Tensor, experts: Tensor, weights: Tensor) -> Tensor:
        return routed_experts(x, self.up_proj, self.down_proj, experts, weights, activation="relu2")


class NemotronHMoE(nn.Module):
    """The mixture (``mixer`` of a ``moe`` layer): routed experts (in the latent width where there is one) plus the
    shared expert on the layer's input."""

    def __init__(self, c: NemotronHConfig):
        super().__init__()
        width = c.latent_size or c.d_model
        self.gate = GroupRouter(c)
        self.experts = SquaredReLUExperts(c.num_experts, width, c.moe_d_ff)
        self.shared_experts = SquaredReLUMLP(c.d_model, c.shared_d_ff, c.mlp_bias)
        if c.latent_size is not None:
            self.fc1_latent_proj = nn.Linear(c.d_model, c.latent_size, bias=c.mlp_bias)
            self.fc2_latent_proj = nn.Linear(c.latent_size, c.d_model, bias=c.mlp_bias)

    def forward(self, x: Tensor) -> Tensor:
        parts: dict[str, nn.Module] = self._modules  # type: ignore[assignment]
        flat = x.reshape(-1, x.shape[-1])
        experts, weights = called(parts["gate"])(flat)
        latent = "fc1_latent_proj" in parts
        h = project_by_name(self, "fc1_latent_proj", flat) if latent else flat
        routed = called(parts["experts"])(h, experts, weights)
        routed = project_by_name(self, "fc2_latent_proj", routed) if latent else routed
        return routed.reshape(x.shape) + called(parts["shared_experts"])(x)


class NemotronHBlock(nn.Module):
    """x + mixer(RMSNorm(x)), the mixer of the layer's kind."""

    def __init__(self, c: NemotronHConfig, layer: int):
        super().__init__()
        self.kind = c.layer_types[layer]
        self.norm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.mixer: nn.Module
        if self.kind == LINEAR:
            self.mixer = Mamba2(c.d_model, c.mamba_heads, c.mamba_head_dim, c.state_size, n_groups=c.n_groups,
                                conv_kernel=c.conv_kernel, conv_bias=c.conv_bias, bias=c.proj_bias,
                                norm_eps=c.norm_eps, chunk_size=c.chunk_size, dt_limit=c.dt_limit)
        elif self.kind == "full_attention":
            self.mixer = MultiHeadAttention(c.d_model, c.num_heads, c.num_kv_heads, head_dim=c.head_dim,
                                            bias=c.attention_bias)
        elif self.kind == "mlp":
            self.mixer = SquaredReLUMLP(c.d_model, c.d_ff, c.mlp_bias)
        else:
            self.mixer = NemotronHMoE(c)

    def forward(self, x: Tensor, *, key_mask: Tensor | None, positions: Tensor | None, cache,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        parts: dict[str, nn.Module] = self._modules  # type: ignore[assignment]
        h = normalised(parts["norm"], x)
        if self.kind in FEED_FORWARD_ONLY:
            return x + called(parts["mixer"])(h), None
        mixed, weights = mix(parts["mixer"], self.kind, h, key_mask=key_mask, positions=positions, cache=cache,
                             need_weights=need_weights)
        return x + mixed, weights


class NemotronHLM(HybridLM):
    """Nemotron-H's decoder (module docstring): ``forward(input_ids, attention_mask, cache=, position_ids=,
    need_weights=)`` -> :class:`~attnkit.models.outputs.LMOutput` as attnkit's other decoders
    (:class:`~attnkit.models.hybrid.HybridLM`), so :func:`attnkit.decoding.generate` drives it; ``need_weights``
    gives the attention of the softmax layers, the implicit attention of the Mamba-2 layers, None for the others."""

    def __init__(self, config: NemotronHConfig):
        super().__init__()
        c = self.config = config
        self.embeddings = nn.Embedding(c.vocab_size, c.d_model)
        self.layers = nn.ModuleList(NemotronHBlock(c, i) for i in range(len(c.layer_types)))
        self.norm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.embeddings.weight

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.embeddings(input_ids)


# --------------------------------------------------------------------------- transformers checkpoints
_READ = {"vocab_size": SIZE, "hidden_size": SIZE, "layers_block_type": nullable(NAMES), "layer_types": nullable(NAMES),
         "hybrid_override_pattern": nullable(NAME), "num_hidden_layers": nullable(SIZE), "num_attention_heads": SIZE,
         "num_key_value_heads": nullable(SIZE), "head_dim": nullable(SIZE), "attention_bias": FLAG,
         "intermediate_size": SIZE, "mlp_hidden_act": NAME, "mlp_bias": FLAG, "ssm_state_size": SIZE,
         "mamba_num_heads": SIZE, "mamba_head_dim": SIZE, "mamba_hidden_act": NAME, "n_groups": SIZE,
         "conv_kernel": SIZE, "expand": SIZE, "time_step_min": NON_NEGATIVE, "time_step_limit": nullable(STEP_LIMIT),
         "use_conv_bias": FLAG, "mamba_proj_bias": FLAG, "use_bias": FLAG, "n_routed_experts": SIZE,
         "num_local_experts": SIZE, "n_shared_experts": SIZE, "moe_intermediate_size": SIZE,
         "moe_shared_expert_intermediate_size": SIZE, "moe_latent_size": nullable(SIZE), "num_experts_per_tok": SIZE,
         "routed_scaling_factor": NUMBER, "n_group": SIZE, "topk_group": SIZE, "norm_topk_prob": FLAG,
         "layer_norm_epsilon": NON_NEGATIVE, "tie_word_embeddings": nullable(FLAG), "max_position_embeddings": SIZE,
         "model_type": NAME, "num_nextn_predict_layers": nullable(COUNT), "mtp_layers_block_type": nullable(NAMES),
         "mtp_hybrid_override_pattern": nullable(NAME), "sliding_window": nullable(SIZE)}
"""Every key the loader reads, with the kind of value it takes (:mod:`.config_values`). ``attention_bias`` is read
as transformers reads it: its Nemotron-H builds no attention biases whatever the key says, so its folders hold none."""
_HARMLESS = HARMLESS | {
    "num_logits_to_keep", "use_mamba_kernels", "time_step_max", "time_step_floor", "mamba_ssm_cache_dtype",
    "moe_shared_expert_overlap", "hidden_dropout", "rescale_prenorm_residual",
    "residual_in_fp32",  # (transformers' model does not read it: its residual stays in the model's dtype)
    "chunk_size",  # (a kernel's tile: attnkit scans by SSD_CHUNK, the same numbers to rounding)
}
_REQUIRED = ("vocab_size", "hidden_size", "num_attention_heads")


def nemotron_h_config_from_hf(hf: dict) -> NemotronHConfig:
    """attnkit's config from a transformers Nemotron-H ``config.json``: every key read, harmless in evaluation, or
    refused by name (:class:`UnsupportedConfigError`). The multi-token-prediction layers
    (``num_nextn_predict_layers``) are training heads: their tensors are left out, as transformers leaves them."""
    checked_keys(hf, ("nemotron_h",), _READ, _HARMLESS, _REQUIRED)
    for key, want in (("mlp_hidden_act", "relu2"), ("mamba_hidden_act", "silu")):
        if hf.get(key, want) != want:
            raise UnsupportedConfigError(f"nemotron_h config: attnkit implements {key} {want!r}, got {hf[key]!r}")
    if hf.get("sliding_window") is not None:
        raise UnsupportedConfigError(f"nemotron_h config: sliding_window={hf['sliding_window']!r}: transformers' "
                                     "Nemotron-H attends over every token, a window is not implemented")
    if hf.get("n_shared_experts", 1) != 1:
        raise UnsupportedConfigError(f"nemotron_h config: n_shared_experts must be 1 (one shared expert of "
                                     f"moe_shared_expert_intermediate_size), got {hf['n_shared_experts']!r}")
    types = _layer_types(hf)
    d_model, heads = hf["hidden_size"], hf["num_attention_heads"]
    mamba_heads, mamba_head_dim = hf.get("mamba_num_heads", 128), hf.get("mamba_head_dim", 64)
    experts = hf.get("n_routed_experts", hf.get("num_local_experts", 8))
    groups = hf.get("n_group", 1)
    if "moe" in types and (experts % groups or not 1 <= hf.get("topk_group", 1) <= groups):
        raise UnsupportedConfigError(f"nemotron_h config: n_group={groups} must divide n_routed_experts={experts} "
                                     f"and topk_group={hf.get('topk_group')!r} lie in 1..n_group")
    low = json_float(hf.get("time_step_min", 0.001), "nemotron_h config: time_step_min")
    return NemotronHConfig(
        vocab_size=hf["vocab_size"], d_model=d_model, layer_types=types, num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads, head_dim=hf.get("head_dim") or d_model // heads,
        attention_bias=False, mamba_heads=mamba_heads, mamba_head_dim=mamba_head_dim,  # (_READ: attention_bias)
        state_size=hf.get("ssm_state_size", 128), n_groups=hf.get("n_groups", 8), conv_kernel=hf.get("conv_kernel", 4),
        conv_bias=bool(hf.get("use_conv_bias", True)), proj_bias=bool(hf.get("use_bias", False)),
        chunk_size=SSD_CHUNK, dt_limit=(low, math.inf), d_ff=hf.get("intermediate_size", 21504),
        mlp_bias=bool(hf.get("mlp_bias", False)), num_experts=experts,
        experts_per_token=hf.get("num_experts_per_tok", 2), moe_d_ff=hf.get("moe_intermediate_size", 7688),
        shared_d_ff=hf.get("moe_shared_expert_intermediate_size", 7688), latent_size=hf.get("moe_latent_size"),
        expert_groups=groups, groups_per_token=hf.get("topk_group", 1), norm_topk_prob=bool(hf.get("norm_topk_prob", True)),
        routed_scaling=float(hf.get("routed_scaling_factor", 1.0)), norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        tie_embeddings=bool(hf.get("tie_word_embeddings")), max_len=hf.get("max_position_embeddings", 4096))


def _layer_types(hf: dict) -> tuple[str, ...]:
    """Each layer's kind: ``layers_block_type`` (or ``layer_types``; older names read as transformers reads them),
    else ``hybrid_override_pattern`` (M, *, -, E)."""
    named = hf.get("layers_block_type") or hf.get("layer_types")
    if named is None:
        pattern = hf.get("hybrid_override_pattern")
        if not isinstance(pattern, str) or set(pattern) - set(_PATTERN):
            raise UnsupportedConfigError(f"nemotron_h config: needs layers_block_type, or hybrid_override_pattern of "
                                         f"the letters {''.join(_PATTERN)}, got {pattern!r}")
        named = [_PATTERN[letter] for letter in pattern]
    types = tuple({"mamba": LINEAR, "attention": "full_attention"}.get(t, t) for t in named)
    if not types or set(types) - set(KINDS):
        raise UnsupportedConfigError(f"nemotron_h config: layers_block_type entries must be of {list(KINDS)}, got "
                                     f"{list(named)}")
    return types


_EXPERT = re.compile(r"^(.*\.mixer\.experts)\.(\d+)\.(up_proj|down_proj)\.weight$")


def _state(tensors: dict[str, Tensor], config: NemotronHConfig) -> dict[str, Tensor]:
    """attnkit's state dict from a checkpoint's tensors: ``backbone.`` or ``model.`` dropped, ``norm_f`` as
    ``norm``, ``o_proj`` as ``out_proj``, experts saved one by one stacked (E, ...), the multi-token-prediction
    layers' tensors (``mtp.``) left out."""
    state: dict[str, Tensor] = {}
    experts: dict[tuple[str, str], dict[int, Tensor]] = {}
    for name, tensor in tensors.items():
        name = name.removeprefix("backbone.").removeprefix("model.")
        if name.startswith("mtp."):
            continue
        name = "norm.weight" if name == "norm_f.weight" else name.replace(".mixer.o_proj.", ".mixer.out_proj.")
        match = _EXPERT.match(name)
        if match:
            experts.setdefault((match[1], match[3]), {})[int(match[2])] = tensor
        else:
            state[name] = tensor
    for (prefix, part), by_index in experts.items():
        if sorted(by_index) != list(range(config.num_experts)):
            raise ValueError(f"{prefix}: the checkpoint holds {part} of experts {sorted(by_index)}, not of all "
                             f"{config.num_experts}")
        state[f"{prefix}.{part}"] = torch.stack([by_index[i] for i in range(config.num_experts)])
    return state


def load_checkpoint_folder(folder: str | os.PathLike, *, dtype: torch.dtype | None = None) -> NemotronHLM:
    """A :class:`NemotronHLM` from a transformers Nemotron-H checkpoint folder (``config.json`` and safetensors), in
    eval mode; every tensor must find its place and every parameter a tensor. Loading never runs code."""
    return load_native_folder(folder, config_from_hf=nemotron_h_config_from_hf, build=NemotronHLM, dtype=dtype,
                              embedding=("backbone.embeddings.weight", "model.embeddings.weight"), state=_state)
