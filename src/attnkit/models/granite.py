"""IBM's Mamba-2 hybrids as attnkit decoders: Bamba, and Granite 4.0-H (transformers' ``granitemoehybrid``): Mamba-2
layers (:class:`~attnkit.layers.Mamba2`) with a few softmax-attention layers between them (``layer_types``), each
followed by a SwiGLU feed-forward network; Granite's with a mixture of experts beside it, and muP multipliers.

    x = embed(ids) * m_embed
    for each layer:  x = x + m_res * mixer(RMSNorm(x));  x = x + m_res * FFN(RMSNorm(x))
        mixer: Mamba2 (linear_attention) or GQA softmax attention, scale m_attn (full_attention)
        FFN: Bamba's SwiGLU; Granite's shared SwiGLU + (top-k softmax router, SwiGLU experts) where it has experts
    logits = lm_head(RMSNorm(x)) / logits_scaling

Bamba has no multipliers (all 1), a scale of 1 / sqrt(head_dim) and RoPE on half of each head; Granite 4.0-H
has no position embedding (``position_embedding_type`` None; "rope" is read too). Module names follow transformers'
(``embed_tokens``, ``layers.i.mamba`` / ``self_attn``, Bamba's ``pre_ff_layernorm`` and ``feed_forward``, Granite's
``post_attention_layernorm``, ``shared_mlp`` and ``block_sparse_moe``; attnkit's ``out_proj`` for ``o_proj`` and
``norm`` for Bamba's ``final_layernorm``), so a checkpoint's tensors find their places by name
(:func:`load_checkpoint_folder`, reached through :func:`attnkit.models.pretrained.load_hf_folder`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..layers import Mamba2, MultiHeadAttention, RotaryEmbedding
from ..layers.calls import called, project_by_name
from ..layers.mamba2 import SSD_CHUNK
from .blocks import Experts, GatedFeedForward, normalised, softmax_top_k
from .config_values import (
    COUNT,
    FLAG,
    INDICES,
    MAPPING,
    NAME,
    NAMES,
    NON_NEGATIVE,
    NUMBER,
    POSITIVE,
    SIZE,
    STEP_LIMIT,
    nullable,
    size_or,
)
from .hf_config import UnsupportedConfigError
from .hybrid import HARMLESS, LINEAR, HybridLM, checked_keys, mix
from .mamba2 import dt_limit_from_hf, mamba_heads_from_hf
from .weights import load_native_folder

__all__ = ["GraniteHybridConfig", "GraniteHybridLM", "MODEL_TYPES", "granite_hybrid_config_from_hf",
           "load_checkpoint_folder"]

MODEL_TYPES = ("bamba", "granitemoehybrid")
"""The transformers model types this decoder is."""


@dataclass(frozen=True)
class GraniteHybridConfig:
    """The sizes of a Bamba or Granite 4.0-H model (transformers' config keys, attnkit's names)."""

    family: str  # "bamba" or "granitemoehybrid": the feed-forward network's names and kind
    vocab_size: int
    d_model: int
    layer_types: tuple[str, ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int  # 0: no position embedding
    rope_theta: float
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
    d_ff: int  # Bamba's feed-forward width; Granite's shared expert's
    mlp_bias: bool = False
    num_experts: int = 0
    experts_per_token: int = 1
    moe_d_ff: int = 0
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_scale: float | None = None  # None: 1 / sqrt(head_dim)
    logits_scaling: float = 1.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    max_len: int = 262144


class SharedMLP(nn.Module):
    """Granite's shared expert: a SwiGLU whose gate and up projections are one ``input_linear`` (2 F, D), the gate's
    rows first, and ``output_linear`` (D, F)."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.input_linear = nn.Linear(d_model, 2 * d_ff, bias=False)
        self.output_linear = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = project_by_name(self, "input_linear", x).chunk(2, dim=-1)
        return project_by_name(self, "output_linear", torch.nn.functional.silu(gate) * up)


class TopKRouter(nn.Module):
    """Granite's router: logits x W^T (float32; float64 for float64), the top k, a softmax over those k."""

    def __init__(self, d_model: int, num_experts: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.weight = nn.Parameter(torch.empty(num_experts, d_model).normal_(0, 0.02))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        # softmax over the top-k logits = the full softmax's top-k probabilities renormalised
        return softmax_top_k(torch.nn.functional.linear(x, self.weight), self.top_k, normalise=True)


class SparseMoE(nn.Module):
    """Granite's mixture of experts (``block_sparse_moe``): the router's top-k SwiGLU experts, weighted."""

    def __init__(self, c: GraniteHybridConfig):
        super().__init__()
        self.router = TopKRouter(c.d_model, c.num_experts, c.experts_per_token)
        self.experts = Experts(c.num_experts, c.d_model, c.moe_d_ff)

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])
        parts: dict[str, nn.Module] = self._modules  # type: ignore[assignment]
        chosen, weights = called(parts["router"])(flat)
        return called(parts["experts"])(flat, chosen, weights.to(x.dtype)).reshape(x.shape)


class GraniteHybridBlock(nn.Module):
    """One layer: the token mixer (Mamba-2 or softmax attention) and the feed-forward network, each after its
    RMSNorm and scaled by the residual multiplier."""

    def __init__(self, c: GraniteHybridConfig, layer: int, rotary: RotaryEmbedding | None):
        super().__init__()
        self.kind = c.layer_types[layer]
        self.residual_multiplier = c.residual_multiplier
        self.input_layernorm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        if self.kind == LINEAR:
            self.mamba = Mamba2(c.d_model, c.mamba_heads, c.mamba_head_dim, c.state_size, n_groups=c.n_groups,
                                conv_kernel=c.conv_kernel, conv_bias=c.conv_bias, bias=c.proj_bias,
                                norm_eps=c.norm_eps, chunk_size=c.chunk_size, dt_limit=c.dt_limit)
        else:
            self.self_attn = MultiHeadAttention(c.d_model, c.num_heads, c.num_kv_heads, head_dim=c.head_dim,
                                                bias=c.attention_bias, rotary=rotary, scale=c.attention_scale)
        self.bamba = c.family == "bamba"
        if self.bamba:
            self.pre_ff_layernorm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
            self.feed_forward = GatedFeedForward(c.d_model, c.d_ff, bias=c.mlp_bias)
        else:
            self.post_attention_layernorm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
            self.shared_mlp = SharedMLP(c.d_model, c.d_ff)
            if c.num_experts > 0:
                self.block_sparse_moe = SparseMoE(c)

    def forward(self, x: Tensor, *, key_mask: Tensor | None, positions: Tensor | None, cache,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        parts: dict[str, nn.Module] = self._modules  # type: ignore[assignment]  # (__getattr__: 1 us a read)
        mixer = parts["mamba"] if self.kind == LINEAR else parts["self_attn"]
        mixed, weights = mix(mixer, self.kind, normalised(parts["input_layernorm"], x), key_mask=key_mask,
                             positions=positions, cache=cache, need_weights=need_weights)
        x = x + self._scaled(mixed)
        if self.bamba:
            return x + called(parts["feed_forward"])(normalised(parts["pre_ff_layernorm"], x)), weights
        h = normalised(parts["post_attention_layernorm"], x)
        ffn = called(parts["shared_mlp"])(h)
        moe = parts.get("block_sparse_moe")
        if moe is not None:
            ffn = called(moe)(h) + ffn
        return x + self._scaled(ffn), weights

    def _scaled(self, h: Tensor) -> Tensor:
        return h if self.residual_multiplier == 1 else h * self.residual_multiplier


class GraniteHybridLM(HybridLM):
    """Bamba's or Granite 4.0-H's decoder (module docstring): ``forward(input_ids, attention_mask, cache=,
    position_ids=, need_weights=)`` -> :class:`~attnkit.models.outputs.LMOutput` as attnkit's other decoders
    (:class:`~attnkit.models.hybrid.HybridLM`), so :func:`attnkit.decoding.generate` drives it; ``need_weights``
    gives the softmax layers' attention and the Mamba-2 layers' implicit attention."""

    def __init__(self, config: GraniteHybridConfig):
        super().__init__()
        c = self.config = config
        rotary = RotaryEmbedding(c.head_dim, c.rope_theta, rotary_dim=c.rotary_dim) if c.rotary_dim else None
        self.embed_tokens = nn.Embedding(c.vocab_size, c.d_model)
        self.layers = nn.ModuleList(GraniteHybridBlock(c, i, rotary) for i in range(len(c.layer_types)))
        self.norm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.logits_scaling = c.logits_scaling
        if c.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def embed(self, input_ids: Tensor) -> Tensor:
        x = self.embed_tokens(input_ids)
        return x if self.config.embedding_multiplier == 1 else x * self.config.embedding_multiplier


# --------------------------------------------------------------------------- transformers checkpoints
_COMMON = {"vocab_size": SIZE, "hidden_size": SIZE, "num_hidden_layers": SIZE, "num_attention_heads": SIZE,
           "num_key_value_heads": nullable(SIZE), "head_dim": nullable(SIZE), "hidden_act": NAME,
           "rms_norm_eps": NON_NEGATIVE, "tie_word_embeddings": nullable(FLAG), "rope_parameters": nullable(MAPPING),
           "rope_theta": POSITIVE, "attention_bias": FLAG, "max_position_embeddings": SIZE, "model_type": NAME,
           "layer_types": nullable(NAMES), "layers_block_type": nullable(NAMES), "mamba_n_heads": SIZE,
           "mamba_d_head": nullable(size_or("auto")), "mamba_n_groups": SIZE, "mamba_d_state": SIZE,
           "mamba_d_conv": SIZE, "mamba_expand": SIZE, "mamba_conv_bias": FLAG, "mamba_proj_bias": FLAG,
           "time_step_limit": nullable(STEP_LIMIT), "intermediate_size": SIZE}
_READ = {
    "bamba": _COMMON | {"attn_layer_indices": nullable(INDICES), "mlp_bias": FLAG,
                        "partial_rotary_factor": nullable(POSITIVE)},
    "granitemoehybrid": _COMMON | {"embedding_multiplier": NUMBER, "logits_scaling": POSITIVE,
                                   "residual_multiplier": NUMBER, "attention_multiplier": NUMBER,
                                   "num_local_experts": COUNT, "num_experts_per_tok": SIZE,
                                   "shared_intermediate_size": SIZE, "position_embedding_type": nullable(NAME)},
}
"""Every key each model type's loader reads, with the kind of value it takes (:mod:`.config_values`)."""
_HARMLESS = HARMLESS | {"num_logits_to_keep", "z_loss_coefficient", "time_step_min", "time_step_max",
                        "time_step_floor", "normalization_function", "init_method",
                        "mamba_chunk_size"}  # (a kernel's tile: attnkit scans by SSD_CHUNK, the same numbers to rounding)
_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
_LEGACY_TYPES = {"mamba": LINEAR, "attention": "full_attention"}  # (the names older checkpoints carry)


def granite_hybrid_config_from_hf(hf: dict) -> GraniteHybridConfig:
    """attnkit's config from a transformers Bamba or GraniteMoeHybrid ``config.json``: every key read, harmless in
    evaluation (``z_loss_coefficient`` and the ``time_step_*`` initialisation bounds train only), or refused by name
    (:class:`UnsupportedConfigError`)."""
    kind = hf.get("model_type") if isinstance(hf, dict) else None
    kind = checked_keys(hf, MODEL_TYPES, _READ.get(str(kind), _COMMON), _HARMLESS, _REQUIRED)
    if hf.get("hidden_act", "silu") != "silu":
        raise UnsupportedConfigError(f"{kind} config: attnkit implements hidden_act 'silu', got {hf['hidden_act']!r}")
    layers, d_model = hf["num_hidden_layers"], hf["hidden_size"]
    types = _layer_types(hf, kind, layers)
    heads = hf["num_attention_heads"]
    kv_heads = hf.get("num_key_value_heads") or heads
    head_dim = hf.get("head_dim") or d_model // heads
    rope = hf.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise UnsupportedConfigError(f"{kind} config: attnkit implements rope_type 'default', got {rope['rope_type']!r}")
    if kind == "bamba":  # (transformers fixes Bamba's partial rotary factor at 0.5 whatever the config says)
        rotary_dim = int(head_dim * 0.5)
        if rotary_dim % 2:
            raise UnsupportedConfigError(f"bamba config: head_dim = {head_dim} gives {rotary_dim} rotary dims (half the "
                                         "head); attnkit rotates an even number of dims (pairs)")
    else:
        position = hf.get("position_embedding_type")
        if position not in (None, "nope", "rope"):
            raise UnsupportedConfigError(f"{kind} config: position_embedding_type must be None or 'rope', got "
                                         f"{position!r}")
        rotary_dim = head_dim if position == "rope" else 0
    inner = hf.get("mamba_expand", 2) * d_model
    mamba_heads, mamba_head_dim = mamba_heads_from_hf(hf, kind, inner,
                                                      f"mamba_expand x hidden_size = {inner} (the mixer's width)")
    dt_limit = dt_limit_from_hf(hf, kind)
    granite = kind == "granitemoehybrid"
    experts = hf.get("num_local_experts", 8) if granite else 0
    scale = hf.get("attention_multiplier", 1.0) if granite else None
    return GraniteHybridConfig(
        family=kind, vocab_size=hf["vocab_size"], d_model=d_model, layer_types=types, num_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, rotary_dim=rotary_dim,
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        attention_bias=bool(hf.get("attention_bias", False)), mamba_heads=mamba_heads, mamba_head_dim=mamba_head_dim,
        state_size=hf.get("mamba_d_state", 256), n_groups=hf.get("mamba_n_groups", 1),
        conv_kernel=hf.get("mamba_d_conv", 4), conv_bias=bool(hf.get("mamba_conv_bias", True)),
        proj_bias=bool(hf.get("mamba_proj_bias", False)), chunk_size=SSD_CHUNK,
        dt_limit=dt_limit,
        d_ff=hf.get("shared_intermediate_size", 1024) if granite else hf.get("intermediate_size", 14336),
        mlp_bias=bool(hf.get("mlp_bias", False)), num_experts=experts,
        experts_per_token=hf.get("num_experts_per_tok", 2) if experts else 1,
        moe_d_ff=hf.get("intermediate_size", 11008) if experts else 0,
        embedding_multiplier=float(hf.get("embedding_multiplier", 1.0)) if granite else 1.0,
        residual_multiplier=float(hf.get("residual_multiplier", 1.0)) if granite else 1.0,
        attention_scale=None if scale is None else float(scale),
        logits_scaling=float(hf.get("logits_scaling", 1.0)) if granite else 1.0,
        norm_eps=hf.get("rms_norm_eps", 1e-5 if not granite else 1e-6),
        tie_embeddings=bool(hf.get("tie_word_embeddings")), max_len=hf.get("max_position_embeddings", 262144))


def _layer_types(hf: dict, kind: str, layers: int) -> tuple[str, ...]:
    """Each layer's kind: ``layer_types`` (or ``layers_block_type``; older checkpoints' "mamba" and "attention"
    read as transformers reads them), else Bamba's ``attn_layer_indices``, else (Granite) all Mamba-2."""
    named = hf.get("layer_types") or hf.get("layers_block_type")
    if named is None:
        indices = set(hf.get("attn_layer_indices") or ())
        named = ["full_attention" if i in indices else LINEAR for i in range(layers)]
    types = tuple(_LEGACY_TYPES.get(t, t) for t in named)
    if len(types) != layers or set(types) - {LINEAR, "full_attention"}:
        raise UnsupportedConfigError(f"{kind} config: layer_types must hold num_hidden_layers = {layers} entries of "
                                     f"'linear_attention' (mamba) or 'full_attention', got {list(named)}")
    return types


_GRANITE_NAMES = {"block_sparse_moe.input_linear.weight": "block_sparse_moe.experts.gate_up_proj",
                  "block_sparse_moe.output_linear.weight": "block_sparse_moe.experts.down_proj",
                  "block_sparse_moe.router.layer.weight": "block_sparse_moe.router.weight"}
"""Granite's expert tensors as its published checkpoints name them, and as transformers 5 holds them."""


def _attnkit_name(name: str) -> str:
    name = name.removeprefix("model.").replace(".self_attn.o_proj.", ".self_attn.out_proj.")
    if name == "final_layernorm.weight":
        return "norm.weight"
    for old, new in _GRANITE_NAMES.items():
        if name.endswith(old):
            return name.removesuffix(old) + new
    return name


def load_checkpoint_folder(folder: str | os.PathLike, *, dtype: torch.dtype | None = None) -> GraniteHybridLM:
    """A :class:`GraniteHybridLM` from a transformers Bamba or GraniteMoeHybrid checkpoint folder (``config.json``
    and safetensors), in eval mode; every tensor must find its place and every parameter a tensor. Loading never
    runs code."""
    return load_native_folder(folder, config_from_hf=granite_hybrid_config_from_hf, build=GraniteHybridLM, dtype=dtype,
                              embedding=("model.embed_tokens.weight",),
                              state=lambda tensors, _: {_attnkit_name(n): t for n, t in tensors.items()})
