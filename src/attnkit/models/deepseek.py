"""DeepSeek-V3-style decoders (DeepSeek-AI 2024): latent attention in every layer, mixture-of-experts MLPs.

    x = x + MLA(RMSNorm(x));  x = x + MLP(RMSNorm(x)),  MLP dense in the first layers, then
    MoE(x) = sum_{e in top-k} g_e FFN_e(x) + FFN_shared(x)

The router scores every expert with a sigmoid, adds a per-expert bias (DeepSeek-V3's auxiliary-loss-free
balancing) to choose, keeps the ``groups_per_token`` best groups of experts (a group's score: its two
best) and then the ``experts_per_token`` best experts in them; the chosen experts' (unbiased) scores,
normalised and scaled, weight their outputs. :func:`attnkit.models.pretrained.load_hf_folder` reads a transformers
DeepSeek-V3 (or V3.2, with DeepSeek sparse attention) checkpoint folder, and :meth:`DeepSeekLM.new_cache`
gives the latent caches :func:`attnkit.decoding.generate` decodes with.

Shapes: B batch, L new tokens, S tokens attended (cached + new), D model dim, V vocabulary.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..functional import kept
from ..functional.checks import check_rank
from ..functional.precision import accumulation_dtype
from ..layers import LatentAttention, LatentCache, LightningIndexer, RotaryEmbedding
from ..layers.calls import called
from .blocks import GatedFeedForward, KeepsFloat32, layer_key_masks, routed_experts, sigmoid_group_top_k
from .config import DeepSeekConfig
from .outputs import LMOutput

__all__ = ["DeepSeekLM", "DeepSeekBlock", "DeepSeekMoE", "load_checkpoint_folder"]

LATENT_NORM_EPS = 1e-6
"""The epsilon of the latents' RMSNorms (q_a_norm, kv_a_norm): 1e-6 whatever the checkpoint's rms_norm_eps,
as DeepSeek's reference code and transformers' DeepseekV3/V32 build them (only the block and final norms read
rms_norm_eps)."""


class DeepSeekMoE(KeepsFloat32):
    """Routed experts (fused weights as transformers keeps them: ``gate_up_proj`` (E, 2 F, D), ``down_proj``
    (E, D, F)), the router ``gate`` (``weight`` (E, D), ``e_score_correction_bias`` (E,)) and the shared
    experts (one SwiGLU of width num_shared_experts x F)."""

    score_bias: Tensor

    def __init__(self, config: DeepSeekConfig):
        super().__init__()
        c = self.config = config
        self.gate_weight = nn.Parameter(torch.zeros(c.num_experts, c.d_model))
        self.register_buffer("score_bias", torch.zeros(c.num_experts), persistent=True)
        self.gate_up_proj = nn.Parameter(torch.empty(c.num_experts, 2 * c.moe_d_ff, c.d_model))
        self.down_proj = nn.Parameter(torch.empty(c.num_experts, c.d_model, c.moe_d_ff))
        for weight in (self.gate_weight, self.gate_up_proj, self.down_proj):
            nn.init.normal_(weight, std=0.02)
        self.shared = (GatedFeedForward(c.d_model, c.moe_d_ff * c.num_shared_experts)
                       if c.num_shared_experts else None)

    FLOAT32 = ("gate_weight", "score_bias")  # (KeepsFloat32: the router reads them in float32)

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(experts (N, k), weights (N, k)) for tokens x (N, D); routing in float32 as transformers routes (float64
        for a float64 model: never below the model, so that a float64 model's tokens route alike in one pass and
        one token at a time)."""
        c = self.config
        acc = accumulation_dtype(x.dtype)
        return sigmoid_group_top_k(x.to(acc) @ self.gate_weight.to(acc).t(), self.score_bias, c.experts_per_token,
                                   groups=c.expert_groups, groups_per_token=c.groups_per_token,
                                   normalise=c.norm_topk_prob, scaling=c.routed_scaling)

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # (N, D)
        experts, weights = self.route(flat)
        out = routed_experts(flat, self.gate_up_proj, self.down_proj, experts, weights).view(shape)
        shared = self._modules.get("shared")  # (None where the config has no shared expert)
        return out if shared is None else out + called(shared)(x)


class DeepSeekBlock(nn.Module):
    """Pre-norm block: latent attention, then the MLP (dense or mixture of experts), each with a residual.
    Parameters: ``attn_norm``, ``self_attn``, ``mlp_norm``, ``mlp``."""

    def __init__(self, config: DeepSeekConfig, rotary: RotaryEmbedding, layer: int, index_rotary: RotaryEmbedding | None):
        super().__init__()
        c = config
        indexer = None
        if c.index_topk is not None:
            assert c.q_lora_rank is not None and index_rotary is not None  # checked by the config
            indexer = LightningIndexer(c.d_model, c.q_lora_rank, num_heads=c.index_heads, head_dim=c.index_head_dim,
                                       rope_dim=c.qk_rope_head_dim, topk=c.index_topk, rotary=index_rotary)
        self.attn_norm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.self_attn = LatentAttention(c.d_model, c.num_heads, kv_lora_rank=c.kv_lora_rank,
                                         qk_nope_head_dim=c.qk_nope_head_dim, qk_rope_head_dim=c.qk_rope_head_dim,
                                         v_head_dim=c.v_head_dim, q_lora_rank=c.q_lora_rank, bias=c.attention_bias,
                                         rotary=rotary, scale=c.attention_scale, norm_eps=LATENT_NORM_EPS,
                                         indexer=indexer)
        self.mlp_norm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.mlp: nn.Module = GatedFeedForward(c.d_model, c.d_ff) if layer < c.first_dense_layers else DeepSeekMoE(c)

    def forward(self, x: Tensor, *, key_mask: Tensor | None, positions: Tensor | None, cache: LatentCache | None,
                need_weights: bool) -> tuple[Tensor, Tensor | None]:
        attended = self.self_attn(self.attn_norm(x), key_mask=key_mask, is_causal=True, positions=positions,
                                  cache=cache, need_weights=need_weights)
        x = x + attended.output
        return x + self.mlp(self.mlp_norm(x)), attended.weights


class DeepSeekLM(nn.Module):
    """A DeepSeek-V3-style language model. Parameters: ``tokens``, ``layers``, ``norm``, ``lm_head``."""

    def __init__(self, config: DeepSeekConfig):
        super().__init__()
        self.config = c = config
        rope: dict[str, Any] = dict(scaling=c.rope_scaling, factor=c.rope_factor, original_max_len=c.rope_original_max_len,
                    beta_fast=c.rope_beta_fast, beta_slow=c.rope_beta_slow, mscale=c.rope_mscale,
                    mscale_all_dim=c.rope_mscale_all_dim)
        rotary = RotaryEmbedding(c.qk_rope_head_dim, c.rope_base, interleaved=c.rope_interleave, **rope)
        index_rotary = RotaryEmbedding(c.qk_rope_head_dim, c.rope_base, **rope) if c.index_topk is not None else None
        self.tokens = nn.Embedding(c.vocab_size, c.d_model)
        self.layers = nn.ModuleList(DeepSeekBlock(c, rotary, layer, index_rotary) for layer in range(c.num_layers))
        self.norm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.tokens.weight

    def new_cache(self) -> list[LatentCache]:
        """One latent cache per layer: (kv_lora_rank + qk_rope_head_dim) numbers a token and layer."""
        return [LatentCache() for _ in self.layers]

    @kept.per_call
    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, *, cache: list[LatentCache] | None = None,
                position_ids: Tensor | None = None, need_weights: bool = False, last_only: bool = False) -> LMOutput:
        """Logits for input_ids (B, L); ``attention_mask`` (B, S) 1 at real tokens, S = the tokens so far, cached and new;
        ``position_ids`` (B, L) (default: the cache's position onwards); ``cache`` from :meth:`new_cache`."""
        check_rank("input_ids", input_ids, 2, "(B, L)")
        B, L = input_ids.shape
        if cache is not None and len(cache) != len(self.layers):
            raise ValueError(f"cache must hold one LatentCache per layer ({len(self.layers)}), got {len(cache)}")
        key_masks = layer_key_masks(attention_mask, B, L, cache)  # (B, S) per layer
        x = self.tokens(input_ids)
        attentions: list[Tensor] | None = [] if need_weights else None
        for i, layer in enumerate(self.layers):
            key_mask = None if key_masks is None else key_masks[0 if cache is None else i]
            x, weights = layer(x, key_mask=key_mask, positions=position_ids, cache=None if cache is None else cache[i],
                               need_weights=need_weights)
            if attentions is not None and weights is not None:
                attentions.append(weights)
        x = self.norm(x)
        return LMOutput(self.lm_head(x[:, -1:] if last_only else x), x, attentions)


# --------------------------------------------------------------------------- transformers checkpoints
_ATTENTION_NAMES = {"q_a_layernorm": "q_a_norm", "kv_a_proj_with_mqa": "kv_a_proj", "kv_a_layernorm": "kv_a_norm",
                    "o_proj": "out_proj"}


def attnkit_name(name: str) -> str | None:
    """attnkit's name of a transformers DeepSeek-V3 tensor (None: one it has no place for)."""
    if name == "model.embed_tokens.weight":
        return "tokens.weight"
    if name in ("model.norm.weight", "lm_head.weight"):
        return name.removeprefix("model.")
    parts = name.split(".")
    if parts[:2] != ["model", "layers"] or len(parts) < 5:
        return None
    layer, part, rest = parts[2], parts[3], parts[4:]
    prefix = f"layers.{layer}."
    if part == "input_layernorm":
        return prefix + "attn_norm." + ".".join(rest)
    if part == "post_attention_layernorm":
        return prefix + "mlp_norm." + ".".join(rest)
    if part == "self_attn":
        return prefix + "self_attn." + ".".join([_ATTENTION_NAMES.get(rest[0], rest[0]), *rest[1:]])
    if part == "mlp":
        moe: dict[tuple[str, ...], str] = {("gate", "weight"): "gate_weight", ("gate", "e_score_correction_bias"): "score_bias",
               ("experts", "gate_up_proj"): "gate_up_proj", ("experts", "down_proj"): "down_proj"}
        if tuple(rest[:2]) in moe:
            return prefix + "mlp." + moe[tuple(rest[:2])]
        if rest[0] == "shared_experts":
            return prefix + "mlp.shared." + ".".join(rest[1:])
        return prefix + "mlp." + ".".join(rest)
    return None


def load_checkpoint_folder(folder: str | os.PathLike, *, dtype: torch.dtype | None = None) -> DeepSeekLM:
    """A :class:`DeepSeekLM` from a transformers DeepSeek-V3 or V3.2 checkpoint folder (``config.json`` and
    ``model.safetensors`` or its shards), in eval mode: DeepSeek's part of
    :func:`attnkit.models.pretrained.load_hf_folder`, the one loader. Every config key is read or refused by name
    (:func:`attnkit.models.hf_config.deepseek_config_from_hf`); every tensor must find its place, and every
    parameter a tensor. Loading never runs code (safetensors)."""
    from .hf_config import deepseek_config_from_hf
    from .weights import config_from_folder, fused_experts, load_placed, read_checkpoint_folder, untied_by_checkpoint

    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"DeepSeek checkpoint folder not found: {folder}")
    config = config_from_folder(folder, deepseek_config_from_hf)
    tensors = read_checkpoint_folder(folder, num_layers=config.num_layers)  # (the multi-token-prediction layer left out)
    config = untied_by_checkpoint(config, tensors, "model.embed_tokens.weight")
    model = DeepSeekLM(config)
    state, unplaced = {}, []
    for name, tensor in fused_experts(tensors, prefix_parts=3).items():
        target = attnkit_name(name)
        if target is None:
            unplaced.append(name)
        else:
            state[target] = tensor
    load_placed(model, state, source=folder, unplaced=unplaced, tied=config.tie_embeddings)
    model = model.to(dtype) if dtype is not None else model
    return model.eval()


def __getattr__(name: str):
    if name == "load_deepseek_folder":  # the old name, one release
        import warnings

        warnings.warn("attnkit.models.deepseek.load_deepseek_folder is deprecated: attnkit.models.pretrained."
                      "load_hf_folder loads every family attnkit has natively, DeepSeek included (same arguments); "
                      "the old name goes in the next release", FutureWarning, stacklevel=2)
        return load_checkpoint_folder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
