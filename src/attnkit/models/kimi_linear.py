"""Kimi Linear as an attnkit decoder (Moonshot AI 2025): Kimi Delta Attention in three of every four layers,
latent attention without positions (MLA, NoPE) in the fourth (``layer_types``), each followed by a dense SwiGLU
MLP (the first layers) or DeepSeek-V3's mixture of experts (sigmoid router, grouped top-k, shared experts).

    x = embed(ids)
    for each layer:  x = x + mixer(RMSNorm(x));  x = x + MLP(RMSNorm(x))
        mixer: KimiDeltaAttention (linear_attention) or LatentAttention(rope=False) (full_attention)
    logits = lm_head(RMSNorm(x))

The pieces are attnkit's own: :class:`~attnkit.layers.KimiDeltaAttention`,
:class:`~attnkit.layers.LatentAttention` and :class:`~attnkit.models.deepseek.DeepSeekMoE`, whose router Kimi
Linear shares. Module names are DeepSeek's (``tokens``, ``layers.i.attn_norm`` / ``self_attn`` / ``mlp_norm`` /
``mlp``, ``norm``, ``lm_head``) and, inside the Kimi Delta Attention layers, transformers'. The cache is one
:class:`~attnkit.layers.LatentCache` per latent-attention layer (576 numbers a token) and one constant-size
:class:`~attnkit.layers.LinearStateCache` per linear layer. :func:`load_checkpoint_folder` (reached through
:func:`attnkit.models.pretrained.load_hf_folder`) reads transformers' layout and the original release's
(``linear_attn_config``, ``block_sparse_moe``, per-expert ``w1/w2/w3``, three convolutions).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ..errors import InputError
from ..layers import KimiDeltaAttention, LatentAttention, LatentCache
from ..layers.calls import called
from . import deepseek
from .blocks import GatedFeedForward, normalised
from .config import DeepSeekConfig
from .config_values import COUNT, FLAG, MAPPING, NAME, NAMES, NON_NEGATIVE, NUMBER, SIZE, nullable
from .hf_config import UnsupportedConfigError
from .hybrid import HARMLESS, LINEAR, HybridLM, checked_keys, mix
from .weights import config_from_folder, fused_experts, load_placed, mixtral_names, read_checkpoint_folder

__all__ = ["KimiLinearConfig", "KimiLinearLM", "kimi_linear_config_from_hf", "load_checkpoint_folder"]


@dataclass(frozen=True)
class KimiLinearConfig:
    """The sizes of a Kimi Linear model (transformers' ``KimiLinearConfig`` keys, attnkit's names)."""

    vocab_size: int
    d_model: int
    layer_types: tuple[str, ...]  # "linear_attention" or "full_attention", one a layer
    sparse_layers: tuple[bool, ...]  # a mixture of experts (True) or a dense MLP, one a layer
    num_heads: int
    kv_lora_rank: int
    q_lora_rank: int | None
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    linear_num_heads: int
    linear_head_dim: int
    conv_kernel: int
    d_ff: int
    moe_d_ff: int
    num_experts: int
    num_shared_experts: int
    experts_per_token: int
    expert_groups: int
    groups_per_token: int
    routed_scaling: float
    norm_topk_prob: bool
    norm_eps: float = 1e-5
    attention_bias: bool = False
    tie_embeddings: bool = False
    max_len: int = 1048576  # the context (model_max_length): generation's bound

    def moe(self) -> DeepSeekConfig:
        """The mixture of experts' sizes as :class:`~attnkit.models.deepseek.DeepSeekMoE` reads them."""
        return DeepSeekConfig(vocab_size=self.vocab_size, d_model=self.d_model, num_layers=1, num_heads=self.num_heads,
                              moe_d_ff=self.moe_d_ff, first_dense_layers=0, num_experts=self.num_experts,
                              num_shared_experts=self.num_shared_experts, experts_per_token=self.experts_per_token,
                              expert_groups=self.expert_groups, groups_per_token=self.groups_per_token,
                              routed_scaling=self.routed_scaling, norm_topk_prob=self.norm_topk_prob, rope_scaling=None)


class KimiLinearBlock(nn.Module):
    """One layer: the token mixer (Kimi Delta Attention or latent attention), then the MLP, each after its RMSNorm.
    Parameters: ``attn_norm``, ``self_attn``, ``mlp_norm``, ``mlp``."""

    def __init__(self, c: KimiLinearConfig, layer: int):
        super().__init__()
        self.kind = c.layer_types[layer]
        self.attn_norm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.self_attn: nn.Module
        if self.kind == LINEAR:
            self.self_attn = KimiDeltaAttention(c.d_model, c.linear_num_heads, c.linear_head_dim,
                                                conv_kernel=c.conv_kernel, norm_eps=c.norm_eps)
        else:
            self.self_attn = LatentAttention(c.d_model, c.num_heads, kv_lora_rank=c.kv_lora_rank,
                                             qk_nope_head_dim=c.qk_nope_head_dim, qk_rope_head_dim=c.qk_rope_head_dim,
                                             v_head_dim=c.v_head_dim, q_lora_rank=c.q_lora_rank, bias=c.attention_bias,
                                             norm_eps=deepseek.LATENT_NORM_EPS, rope=False)
        self.mlp_norm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.mlp: nn.Module = deepseek.DeepSeekMoE(c.moe()) if c.sparse_layers[layer] else GatedFeedForward(c.d_model, c.d_ff)

    def forward(self, x: Tensor, *, key_mask: Tensor | None, positions: Tensor | None, cache,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        parts: dict[str, nn.Module] = self._modules  # type: ignore[assignment]  # (__getattr__: 1 us a read)
        mixed, weights = mix(parts["self_attn"], self.kind, normalised(parts["attn_norm"], x), key_mask=key_mask,
                             positions=positions, cache=cache, need_weights=need_weights)
        x = x + mixed
        return x + called(parts["mlp"])(normalised(parts["mlp_norm"], x)), weights


class KimiLinearLM(HybridLM):
    """Kimi Linear's decoder (module docstring): ``forward(input_ids, attention_mask, cache=, position_ids=)`` ->
    :class:`LMOutput` as attnkit's other decoders (:class:`~attnkit.models.hybrid.HybridLM`; the positions only order
    the causal mask: no layer rotates), so :func:`attnkit.decoding.generate` drives it."""

    def __init__(self, config: KimiLinearConfig):
        super().__init__()
        c = self.config = config
        self.tokens = nn.Embedding(c.vocab_size, c.d_model)
        self.layers = nn.ModuleList(KimiLinearBlock(c, i) for i in range(len(c.layer_types)))
        self.norm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.tokens.weight

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.tokens(input_ids)

    def softmax_cache(self) -> LatentCache:
        return LatentCache()  # the latent and the shared key part, 576 numbers a token and layer at Kimi's sizes


# --------------------------------------------------------------------------- transformers checkpoints
_READ = {"vocab_size": SIZE, "hidden_size": SIZE, "num_hidden_layers": SIZE, "layer_types": nullable(NAMES),
         "mlp_layer_types": nullable(NAMES), "num_attention_heads": SIZE, "num_key_value_heads": nullable(SIZE),
         "kv_lora_rank": SIZE, "q_lora_rank": nullable(SIZE), "qk_nope_head_dim": SIZE, "qk_rope_head_dim": SIZE,
         "v_head_dim": SIZE, "qk_head_dim": nullable(SIZE), "head_dim": nullable(SIZE),
         "linear_num_heads": nullable(SIZE), "linear_head_dim": nullable(SIZE),
         "linear_conv_kernel_dim": nullable(SIZE), "linear_attn_config": nullable(MAPPING),
         "first_k_dense_replace": COUNT, "intermediate_size": SIZE, "moe_intermediate_size": SIZE,
         "num_experts": nullable(SIZE), "num_local_experts": nullable(SIZE), "num_experts_per_token": nullable(SIZE),
         "num_experts_per_tok": nullable(SIZE), "num_shared_experts": nullable(COUNT),
         "n_shared_experts": nullable(COUNT), "num_expert_group": nullable(SIZE), "n_group": nullable(SIZE),
         "topk_group": nullable(SIZE), "routed_scaling_factor": NUMBER, "moe_renormalize": nullable(FLAG),
         "norm_topk_prob": nullable(FLAG), "rms_norm_eps": NON_NEGATIVE, "tie_word_embeddings": nullable(FLAG),
         "hidden_act": NAME, "attention_bias": FLAG, "model_type": NAME, "mla_use_nope": FLAG,
         "moe_router_activation_func": NAME, "moe_layer_freq": SIZE, "num_nextn_predict_layers": COUNT,
         "use_grouped_topk": FLAG, "max_position_embeddings": nullable(SIZE), "model_max_length": nullable(SIZE)}
"""Every key the loader reads, with the kind of value it takes (:mod:`.config_values`); null where the loader reads
an alias (transformers' key or the original release's) or a default instead."""
_HARMLESS = HARMLESS | {"auto_map", "pretraining_tp"}


_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim",
             "qk_rope_head_dim", "v_head_dim", "intermediate_size", "moe_intermediate_size")


def _either(hf: dict, *names: str, default=None):
    """The first of ``names`` the config has (transformers' key or its alias, the original release's)."""
    return next((hf[name] for name in names if hf.get(name) is not None), default)


def kimi_linear_config_from_hf(hf: dict) -> KimiLinearConfig:
    """attnkit's config from a Kimi Linear ``config.json`` (transformers' keys or the original release's): every key
    read, harmless in evaluation, or refused by name (:class:`UnsupportedConfigError`)."""
    checked_keys(hf, ("kimi_linear",), _READ, _HARMLESS, _REQUIRED)
    refusals = {"hidden_act": ("silu", hf.get("hidden_act", "silu")), "mla_use_nope": (True, hf.get("mla_use_nope", True)),
                "moe_router_activation_func": ("sigmoid", hf.get("moe_router_activation_func", "sigmoid")),
                "moe_layer_freq": (1, hf.get("moe_layer_freq", 1)),
                "num_nextn_predict_layers": (0, hf.get("num_nextn_predict_layers", 0)),
                "use_grouped_topk": (True, hf.get("use_grouped_topk", True))}
    for key, (implemented, got) in refusals.items():
        if got != implemented:
            raise UnsupportedConfigError(f"kimi_linear config: attnkit implements {key}={implemented!r}, got {got!r}")
    layers = hf["num_hidden_layers"]
    linear = hf.get("linear_attn_config") or {}
    types = hf.get("layer_types")
    if types is None and "full_attn_layers" in linear and "kda_layers" in linear:  # the original's 1-based lists
        types = ["full_attention" if i + 1 in linear["full_attn_layers"] else "linear_attention" for i in range(layers)]
        if sorted([*linear["full_attn_layers"], *linear["kda_layers"]]) != list(range(1, layers + 1)):
            raise UnsupportedConfigError("kimi_linear config: linear_attn_config's full_attn_layers and kda_layers must "
                                         f"name each of the {layers} layers once")
    types = types or ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(layers)]
    bad = sorted(set(types) - {"linear_attention", "full_attention"})
    if len(types) != layers or bad:
        raise UnsupportedConfigError(f"kimi_linear config: layer_types must give linear_attention or full_attention for "
                                     f"each of the {layers} layers, got {types!r}")
    dense = hf.get("first_k_dense_replace", 1)
    mlp_types = hf.get("mlp_layer_types") or ["dense" if i < dense else "sparse" for i in range(layers)]
    if len(mlp_types) != layers or set(mlp_types) - {"dense", "sparse"}:
        raise UnsupportedConfigError(f"kimi_linear config: mlp_layer_types must give dense or sparse for each of the "
                                     f"{layers} layers, got {mlp_types!r}")
    heads = hf["num_attention_heads"]
    if hf.get("num_key_value_heads") not in (None, heads):
        raise UnsupportedConfigError("kimi_linear config: latent attention has as many key heads as query heads, got "
                                     f"num_key_value_heads={hf['num_key_value_heads']} for {heads}")
    return KimiLinearConfig(
        vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], layer_types=tuple(types),
        sparse_layers=tuple(t == "sparse" for t in mlp_types), num_heads=heads, kv_lora_rank=hf["kv_lora_rank"],
        q_lora_rank=hf.get("q_lora_rank"), qk_nope_head_dim=hf["qk_nope_head_dim"],
        qk_rope_head_dim=hf["qk_rope_head_dim"], v_head_dim=hf["v_head_dim"],
        linear_num_heads=_either(hf, "linear_num_heads", default=linear.get("num_heads", 32)),
        linear_head_dim=_either(hf, "linear_head_dim", default=linear.get("head_dim", 128)),
        conv_kernel=_either(hf, "linear_conv_kernel_dim", default=linear.get("short_conv_kernel_size", 4)),
        d_ff=hf["intermediate_size"], moe_d_ff=hf["moe_intermediate_size"],
        num_experts=_either(hf, "num_experts", "num_local_experts", default=256),
        num_shared_experts=_either(hf, "num_shared_experts", "n_shared_experts", default=1),
        experts_per_token=_either(hf, "num_experts_per_token", "num_experts_per_tok", default=8),
        expert_groups=_either(hf, "num_expert_group", "n_group", default=1),
        groups_per_token=_either(hf, "topk_group", default=1),
        routed_scaling=float(hf.get("routed_scaling_factor", 1.0)),
        norm_topk_prob=bool(_either(hf, "moe_renormalize", "norm_topk_prob", default=True)),
        norm_eps=hf.get("rms_norm_eps", 1e-5), attention_bias=bool(hf.get("attention_bias", False)),
        tie_embeddings=False,  # transformers' Kimi Linear never ties its head, whatever tie_word_embeddings says
        max_len=_either(hf, "model_max_length", "max_position_embeddings", default=1048576))


def _transformers_layout(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """The original release's tensor names in transformers' layout (what transformers' conversion does on load, and
    undoes on save): Mixtral's expert names (:func:`~attnkit.models.weights.mixtral_names`), the forget gate's
    ``f_a_proj``, ``f_b_proj``, ``dt_bias``, ``A_log`` under ``forget_gate``, and the three depthwise convolutions
    ``q_conv1d``, ``k_conv1d``, ``v_conv1d`` stacked into one ``conv1d``."""
    out: dict[str, Tensor] = {}
    convolutions: dict[str, dict[str, Tensor]] = {}
    for name, tensor in mixtral_names(tensors).items():
        parts = name.split(".")
        if len(parts) >= 5 and parts[3] == "self_attn" and parts[4] in ("f_a_proj", "f_b_proj", "dt_bias", "A_log"):
            parts.insert(4, "forget_gate")
        elif len(parts) >= 6 and parts[3] == "self_attn" and parts[4] in ("q_conv1d", "k_conv1d", "v_conv1d"):
            convolutions.setdefault(".".join(parts[:4]), {})[parts[4][0]] = tensor
            continue
        out[".".join(parts)] = tensor
    for prefix, pieces in convolutions.items():
        if set(pieces) != {"q", "k", "v"}:
            raise InputError(f"{prefix}: the checkpoint has {sorted(pieces)} of the q, k and v convolutions")
        out[prefix + ".conv1d.weight"] = torch.cat([pieces["q"], pieces["k"], pieces["v"]], dim=0)
    return out


def _attnkit_name(name: str, config: KimiLinearConfig) -> str | None:
    """attnkit's name of a transformers Kimi Linear tensor (None: one it has no place for): DeepSeek's names, but the
    Kimi Delta Attention layers keep transformers' own."""
    parts = name.split(".")
    if parts[:2] == ["model", "layers"] and len(parts) > 4 and parts[3] == "self_attn" and parts[2].isdigit() \
            and int(parts[2]) < len(config.layer_types) and config.layer_types[int(parts[2])] == "linear_attention":
        return f"layers.{parts[2]}.self_attn." + ".".join(parts[4:])
    return deepseek.attnkit_name(name)


def load_checkpoint_folder(folder: str | os.PathLike, *, dtype: torch.dtype | None = None) -> KimiLinearLM:
    """A :class:`KimiLinearLM` from a Kimi Linear checkpoint folder (``config.json`` and safetensors), in eval mode;
    every tensor must find its place and every parameter a tensor. Loading never runs code."""
    folder = Path(folder)
    config = config_from_folder(folder, kimi_linear_config_from_hf)
    tensors = fused_experts(_transformers_layout(read_checkpoint_folder(folder)), prefix_parts=3)
    model = KimiLinearLM(config)
    state, unplaced = {}, []
    for name, tensor in tensors.items():
        target = _attnkit_name(name, config)
        if target is None:
            unplaced.append(name)
        else:
            state[target] = tensor
    load_placed(model, state, source=folder, unplaced=unplaced, tied=config.tie_embeddings)
    model = model if dtype is None else model.to(dtype)
    return model.eval()
