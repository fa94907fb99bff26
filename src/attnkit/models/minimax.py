"""MiniMax-01 as an attnkit decoder (MiniMax 2025): lightning attention in most layers, softmax attention in the
others (``layer_types``), a mixture of experts after each, and residuals scaled per kind of layer.

    h = RMSNorm(x);  x = alpha_a h + beta_a mixer(h)          (the residual is the normed input)
    h = RMSNorm(x);  x = alpha_m h + beta_m MoE(h)
        mixer: LightningAttention (linear_attention) or MultiHeadAttention with RoPE, GQA (full_attention)
        MoE: softmax router (float32), top-k experts (SwiGLU), their probabilities renormalised
    logits = lm_head(RMSNorm(x))

Module names follow transformers' (``embed_tokens``, ``layers.i.input_layernorm`` / ``self_attn`` /
``post_attention_layernorm`` / ``mlp.gate`` / ``mlp.experts``; attnkit's ``out_proj`` for the softmax layers'
``o_proj``). The cache is one :class:`~attnkit.layers.KVCache` per softmax layer and one constant-size
:class:`~attnkit.layers.LinearStateCache` per lightning layer. :func:`load_checkpoint_folder` (reached through
:func:`attnkit.models.pretrained.load_hf_folder`) reads the checkpoint's layout (Mixtral's expert names, as
transformers also writes them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor, nn

from ..layers import KVCache, LightningAttention, MultiHeadAttention, RotaryEmbedding
from ..layers.calls import called, project_by_name
from .blocks import Experts, normalised, softmax_top_k
from .config_values import FLAG, MAPPING, NAME, NAMES, NON_NEGATIVE, NUMBER, POSITIVE, SIZE, nullable
from .hf_config import UnsupportedConfigError
from .hybrid import HARMLESS, LINEAR, HybridLM, checked_keys, mix
from .weights import (
    config_from_folder,
    fused_experts,
    load_placed,
    mixtral_names,
    read_checkpoint_folder,
    untied_by_checkpoint,
)

__all__ = ["MiniMaxConfig", "MiniMaxLM", "minimax_config_from_hf", "load_checkpoint_folder"]


LIGHTNING_NORM_EPS = 1e-6
"""The epsilon of a lightning layer's output RMSNorm: 1e-6 whatever the checkpoint's rms_norm_eps, as MiniMax builds
it (transformers' MiniMaxLightningAttention takes its norm's default; with rms_norm_eps, 1e-5, a 4-layer model's
logits moved by 4e-4)."""


@dataclass(frozen=True)
class MiniMaxConfig:
    """The sizes of a MiniMax-01 model (transformers' ``MiniMaxConfig`` keys, attnkit's names)."""

    vocab_size: int
    d_model: int
    layer_types: tuple[str, ...]  # "linear_attention" or "full_attention", one a layer
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    block_size: int  # the lightning layers' block (their decays' tables)
    d_ff: int  # one expert's width
    num_experts: int
    experts_per_token: int
    full_alpha: float = 1.0  # residual scales: alpha multiplies the normed input, beta the layer's output
    full_beta: float = 1.0
    linear_alpha: float = 1.0
    linear_beta: float = 1.0
    mlp_alpha: float = 1.0
    mlp_beta: float = 1.0
    window: int | None = None  # the softmax layers' sliding window (transformers' sliding_window)
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    max_len: int = 131072  # the context (max_position_embeddings): generation's bound


class MiniMaxMoE(nn.Module):
    """MiniMax's mixture of experts: a softmax router ``gate`` and the top-k SwiGLU ``experts``, their probabilities
    renormalised to sum 1 (no shared expert)."""

    def __init__(self, c: MiniMaxConfig):
        super().__init__()
        self.top_k = c.experts_per_token
        self.gate = nn.Linear(c.d_model, c.num_experts, bias=False)
        self.experts = Experts(c.num_experts, c.d_model, c.d_ff)

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])
        chosen, weights = softmax_top_k(project_by_name(self, "gate", flat), self.top_k, normalise=True)
        experts: nn.Module = self._modules["experts"]  # type: ignore[assignment]  # (__getattr__: 1 us a read)
        return called(experts)(flat, chosen, weights).view(x.shape)


class MiniMaxBlock(nn.Module):
    """One layer (module docstring). Parameters: ``input_layernorm``, ``self_attn``, ``post_attention_layernorm``,
    ``mlp``."""

    def __init__(self, c: MiniMaxConfig, layer: int, rotary: RotaryEmbedding):
        super().__init__()
        self.kind = c.layer_types[layer]
        self.window = c.window
        self.input_layernorm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.self_attn: nn.Module
        if self.kind == LINEAR:
            self.self_attn = LightningAttention(c.d_model, c.num_heads, c.head_dim, layer_idx=layer,
                                                num_layers=len(c.layer_types), block_size=c.block_size,
                                                norm_eps=LIGHTNING_NORM_EPS)
            self.alpha, self.beta = c.linear_alpha, c.linear_beta
        else:
            self.self_attn = MultiHeadAttention(c.d_model, c.num_heads, c.num_kv_heads, head_dim=c.head_dim, bias=False,
                                                rotary=rotary)
            self.alpha, self.beta = c.full_alpha, c.full_beta
        self.post_attention_layernorm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.mlp = MiniMaxMoE(c)
        self.mlp_alpha, self.mlp_beta = c.mlp_alpha, c.mlp_beta

    def forward(self, x: Tensor, *, key_mask: Tensor | None, positions: Tensor | None, cache,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        parts: dict[str, nn.Module] = self._modules  # type: ignore[assignment]  # (__getattr__: 1 us a read)
        h = normalised(parts["input_layernorm"], x)
        options = {} if self.kind == LINEAR else {"window": self.window}
        mixed, weights = mix(parts["self_attn"], self.kind, h, key_mask=key_mask, positions=positions, cache=cache,
                             need_weights=need_weights, **options)
        x = self.alpha * h + self.beta * mixed
        h = normalised(parts["post_attention_layernorm"], x)
        return self.mlp_alpha * h + self.mlp_beta * called(parts["mlp"])(h), weights


class MiniMaxLM(HybridLM):
    """MiniMax-01's decoder (module docstring): ``forward(input_ids, attention_mask, cache=, position_ids=)`` ->
    :class:`LMOutput` as attnkit's other decoders (:class:`~attnkit.models.hybrid.HybridLM`), so
    :func:`attnkit.decoding.generate` drives it."""

    def __init__(self, config: MiniMaxConfig):
        super().__init__()
        c = self.config = config
        rotary = RotaryEmbedding(c.head_dim, c.rope_theta)
        self.embed_tokens = nn.Embedding(c.vocab_size, c.d_model)
        self.layers = nn.ModuleList(MiniMaxBlock(c, i, rotary) for i in range(len(c.layer_types)))
        self.norm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.embed_tokens(input_ids)

    def softmax_cache(self) -> KVCache:
        return KVCache(window=self.config.window)  # rolling where the model has a sliding window


# --------------------------------------------------------------------------- transformers checkpoints
_READ = {"vocab_size": SIZE, "hidden_size": SIZE, "num_hidden_layers": SIZE, "layer_types": nullable(NAMES),
         "num_attention_heads": SIZE, "num_key_value_heads": nullable(SIZE), "head_dim": nullable(SIZE),
         "rope_parameters": nullable(MAPPING), "rope_theta": POSITIVE, "block_size": SIZE, "intermediate_size": SIZE,
         "num_local_experts": SIZE, "num_experts_per_tok": SIZE, "full_attn_alpha_factor": NUMBER,
         "full_attn_beta_factor": NUMBER, "linear_attn_alpha_factor": NUMBER, "linear_attn_beta_factor": NUMBER,
         "mlp_alpha_factor": NUMBER, "mlp_beta_factor": NUMBER, "sliding_window": nullable(SIZE),
         "rms_norm_eps": NON_NEGATIVE, "tie_word_embeddings": nullable(FLAG), "hidden_act": NAME, "model_type": NAME,
         "max_position_embeddings": SIZE}
"""Every key the loader reads, with the kind of value it takes (:mod:`.config_values`)."""
_HARMLESS = HARMLESS | {"router_jitter_noise"}
_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def minimax_config_from_hf(hf: dict) -> MiniMaxConfig:
    """attnkit's config from a transformers MiniMax ``config.json``: every key read, harmless in evaluation, or
    refused by name (:class:`UnsupportedConfigError`)."""
    checked_keys(hf, ("minimax",), _READ, _HARMLESS, _REQUIRED)
    if hf.get("hidden_act", "silu") != "silu":
        raise UnsupportedConfigError(f"minimax config: attnkit implements hidden_act 'silu', got {hf['hidden_act']!r}")
    rope = hf.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise UnsupportedConfigError(f"minimax config: attnkit implements rope_type 'default', got {rope['rope_type']!r}")
    layers = hf["num_hidden_layers"]
    types = hf.get("layer_types") or ["full_attention" if i % 2 == 0 else "linear_attention" for i in range(layers)]
    if len(types) != layers or set(types) - {"linear_attention", "full_attention"}:
        raise UnsupportedConfigError(f"minimax config: layer_types must give linear_attention or full_attention for "
                                     f"each of the {layers} layers, got {types!r}")
    heads = hf["num_attention_heads"]
    return MiniMaxConfig(
        vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], layer_types=tuple(types), num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads, head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 1e6))), block_size=hf.get("block_size", 256),
        d_ff=hf["intermediate_size"], num_experts=hf.get("num_local_experts", 8),
        experts_per_token=hf.get("num_experts_per_tok", 2),
        full_alpha=float(hf.get("full_attn_alpha_factor", 1)), full_beta=float(hf.get("full_attn_beta_factor", 1)),
        linear_alpha=float(hf.get("linear_attn_alpha_factor", 1)), linear_beta=float(hf.get("linear_attn_beta_factor", 1)),
        mlp_alpha=float(hf.get("mlp_alpha_factor", 1)), mlp_beta=float(hf.get("mlp_beta_factor", 1)),
        window=hf.get("sliding_window"), norm_eps=hf.get("rms_norm_eps", 1e-5),
        tie_embeddings=bool(hf.get("tie_word_embeddings")), max_len=hf.get("max_position_embeddings", 131072))


_DERIVED_BUFFERS = ("slope_rate", "query_decay", "key_decay", "diagonal_decay")
"""The lightning layers' decay tables: computed from the config, taken from a checkpoint where it has them."""


def load_checkpoint_folder(folder: str | os.PathLike, *, dtype=None) -> MiniMaxLM:
    """A :class:`MiniMaxLM` from a transformers MiniMax checkpoint folder (``config.json`` and safetensors), in eval
    mode; every tensor must find its place and every parameter a tensor. Loading never runs code."""
    folder = Path(folder)
    config = config_from_folder(folder, minimax_config_from_hf)
    tensors = fused_experts(mixtral_names(read_checkpoint_folder(folder)), prefix_parts=3)
    config = untied_by_checkpoint(config, tensors, "model.embed_tokens.weight")
    state = {name.removeprefix("model.").replace(".self_attn.o_proj.", ".self_attn.out_proj."): tensor
             for name, tensor in tensors.items()}
    model = MiniMaxLM(config)
    load_placed(model, state, source=folder, tied=config.tie_embeddings, derived=_DERIVED_BUFFERS)
    model = model if dtype is None else model.to(dtype)
    return model.eval()
