"""TII's Falcon-H1 as an attnkit decoder: in every layer a Mamba-2 mixer and GQA softmax attention side by side on the
same normed input, their outputs summed, then a SwiGLU feed-forward network; muP multipliers throughout.

    x = embed(ids) * m_embed
    for each layer:
        h = RMSNorm(x)
        x = x + m_ssm_out Mamba2(h * m_ssm_in) + m_attn_out Attention(h * m_attn_in)
        x = x + m_down down(up(h') * silu(m_gate gate(h')))              h' = RMSNorm(x)
    logits = lm_head(RMSNorm(x)) * m_lm_head

The Mamba-2 projection's five sections (z, x, B, C, dt) are scaled by ``ssm_multipliers`` (transformers' muP
vector); its output is normed or not (``mamba_rms_norm``), the norm before or after the gate
(``mamba_norm_before_gate``). The attention's keys are scaled by ``key_multiplier`` (here folded into its scale: RoPE
and the dot product are linear in k). Module names follow transformers' (``embed_tokens``, ``layers.i.mamba``,
``layers.i.self_attn``, ``input_layernorm``, ``pre_ff_layernorm``, ``feed_forward``; attnkit's ``norm`` for
``final_layernorm`` and ``out_proj`` for ``o_proj``), so a checkpoint's tensors find their places by name
(:func:`load_checkpoint_folder`, reached through :func:`attnkit.models.pretrained.load_hf_folder`). Each layer's cache
holds both its attention's keys and values and its Mamba-2 state (:class:`ParallelCache`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..layers import KVCache, LinearStateCache, Mamba2, MultiHeadAttention, RotaryEmbedding
from ..layers.calls import called, project_by_name
from ..layers.mamba2 import SSD_CHUNK
from .blocks import normalised
from .config_values import (
    FLAG,
    MAPPING,
    NAME,
    NAMES,
    NON_NEGATIVE,
    NUMBER,
    NUMBERS,
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

__all__ = ["FalconH1Config", "FalconH1LM", "ParallelCache", "falcon_h1_config_from_hf", "load_checkpoint_folder"]

PARALLEL = "hybrid"
"""Falcon-H1's one kind of layer (transformers' ``layers_block_type``): Mamba-2 and attention side by side."""


@dataclass(frozen=True)
class FalconH1Config:
    """The sizes and multipliers of a Falcon-H1 model (transformers' ``FalconH1Config`` keys, attnkit's names)."""

    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    attention_bias: bool
    mamba_heads: int
    mamba_head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    conv_bias: bool
    proj_bias: bool
    projectors_bias: bool
    chunk_size: int
    dt_limit: tuple[float, float]
    mamba_rms_norm: bool
    mamba_norm_before_gate: bool
    d_ff: int
    mlp_bias: bool = False
    embedding_multiplier: float = 1.0
    lm_head_multiplier: float = 1.0
    mlp_multipliers: tuple[float, float] = (1.0, 1.0)  # gate, down
    key_multiplier: float = 1.0
    attention_in_multiplier: float = 1.0
    attention_out_multiplier: float = 1.0
    ssm_multipliers: tuple[float, ...] = (1.0,) * 5  # z, x, B, C, dt
    ssm_in_multiplier: float = 1.0
    ssm_out_multiplier: float = 1.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    max_len: int = 8192


class ParallelCache:
    """A Falcon-H1 layer's cache: its attention's :class:`~attnkit.layers.KVCache` (``attention``) and its Mamba-2's
    :class:`~attnkit.layers.LinearStateCache` (``ssm``). The layer's key mask is its attention's
    (:meth:`attended_length`); the Mamba-2 reads the call's own columns of it."""

    def __init__(self):
        self.attention = KVCache()
        self.ssm = LinearStateCache()

    @property
    def position(self) -> int:
        return self.attention.position

    def attended_length(self, new: int) -> int:
        return self.attention.attended_length(new)


class FalconH1MLP(nn.Module):
    """down(up(x) * silu(m_gate gate(x))) * m_down, transformers' names (``gate_proj``, ``up_proj``, ``down_proj``)."""

    def __init__(self, d_model: int, d_ff: int, multipliers: tuple[float, float], bias: bool = False):
        super().__init__()
        self.gate_multiplier, self.down_multiplier = multipliers
        self.gate_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        gate = torch.nn.functional.silu(project_by_name(self, "gate_proj", x) * self.gate_multiplier)
        return project_by_name(self, "down_proj", project_by_name(self, "up_proj", x) * gate) * self.down_multiplier


class FalconH1Block(nn.Module):
    """One layer (module docstring): Mamba-2 and attention on one normed input, summed, then the MLP."""

    kind = PARALLEL

    def __init__(self, c: FalconH1Config, rotary: RotaryEmbedding):
        super().__init__()
        self.c = c
        self.input_layernorm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.mamba = Mamba2(c.d_model, c.mamba_heads, c.mamba_head_dim, c.state_size, n_groups=c.n_groups,
                            conv_kernel=c.conv_kernel, conv_bias=c.conv_bias, bias=c.proj_bias, norm_eps=c.norm_eps,
                            chunk_size=c.chunk_size, dt_limit=c.dt_limit, norm=c.mamba_rms_norm,
                            norm_before_gate=c.mamba_norm_before_gate, out_bias=c.projectors_bias,
                            projection_multipliers=c.ssm_multipliers)
        self.self_attn = MultiHeadAttention(c.d_model, c.num_heads, c.num_kv_heads, head_dim=c.head_dim,
                                            bias=c.attention_bias, rotary=rotary,
                                            scale=c.key_multiplier / math.sqrt(c.head_dim))
        self.pre_ff_layernorm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.feed_forward = FalconH1MLP(c.d_model, c.d_ff, c.mlp_multipliers, c.mlp_bias)

    def forward(self, x: Tensor, *, key_mask: Tensor | None, positions: Tensor | None, cache: ParallelCache | None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        c = self.c
        parts: dict[str, nn.Module] = self._modules  # type: ignore[assignment]  # (__getattr__: 1 us a read)
        h = normalised(parts["input_layernorm"], x)
        ssm, ssm_weights = mix(parts["mamba"], LINEAR, _times(h, c.ssm_in_multiplier), key_mask=key_mask,
                               positions=positions, cache=None if cache is None else cache.ssm,
                               need_weights=need_weights)
        attended, weights = mix(parts["self_attn"], "full_attention", _times(h, c.attention_in_multiplier),
                                key_mask=key_mask, positions=positions, cache=None if cache is None else cache.attention,
                                need_weights=need_weights)
        x = x + (_times(ssm, c.ssm_out_multiplier) + _times(attended, c.attention_out_multiplier))
        x = x + called(parts["feed_forward"])(normalised(parts["pre_ff_layernorm"], x))
        return x, None if weights is None else _side_by_side(weights, ssm_weights)


def _times(x: Tensor, factor: float) -> Tensor:
    return x if factor == 1 else x * factor


def _side_by_side(weights: Tensor, implicit: Tensor | None) -> Tensor:
    """A layer's attention heads (B, H, L, S) and its Mamba-2 heads' implicit attention (B, Hm, L, L) as one
    (B, H + Hm, L, S): the Mamba-2 heads' columns of cached tokens are NaN (what they took of those is in its state,
    not a weight of each token)."""
    assert implicit is not None
    S, L = weights.shape[-1], implicit.shape[-1]
    if S > L:
        implicit = torch.nn.functional.pad(implicit, (S - L, 0), value=math.nan)
    return torch.cat([weights, implicit.to(weights.dtype)], dim=1)


class FalconH1LM(HybridLM):
    """Falcon-H1's decoder (module docstring): ``forward(input_ids, attention_mask, cache=, position_ids=,
    need_weights=)`` -> :class:`~attnkit.models.outputs.LMOutput` as attnkit's other decoders
    (:class:`~attnkit.models.hybrid.HybridLM`), so :func:`attnkit.decoding.generate` drives it; ``need_weights`` gives
    each layer's attention heads followed by its Mamba-2 heads' implicit attention (:func:`_side_by_side`)."""

    def __init__(self, config: FalconH1Config):
        super().__init__()
        c = self.config = config
        rotary = RotaryEmbedding(c.head_dim, c.rope_theta)
        self.embed_tokens = nn.Embedding(c.vocab_size, c.d_model)
        self.layers = nn.ModuleList(FalconH1Block(c, rotary) for _ in range(c.num_layers))
        self.norm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.logits_scaling = 1 / c.lm_head_multiplier
        if c.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def new_cache(self) -> list:
        """One :class:`ParallelCache` a layer."""
        return [ParallelCache() for _ in self.layers]

    def embed(self, input_ids: Tensor) -> Tensor:
        return _times(self.embed_tokens(input_ids), self.config.embedding_multiplier)


# --------------------------------------------------------------------------- transformers checkpoints
_READ = {"vocab_size": SIZE, "hidden_size": SIZE, "intermediate_size": SIZE, "num_hidden_layers": SIZE,
         "num_attention_heads": SIZE, "num_key_value_heads": nullable(SIZE), "head_dim": nullable(SIZE),
         "hidden_act": NAME, "rms_norm_eps": NON_NEGATIVE, "tie_word_embeddings": nullable(FLAG),
         "max_position_embeddings": SIZE, "mamba_d_ssm": nullable(SIZE), "mamba_n_heads": SIZE,
         "mamba_d_head": nullable(size_or("auto")), "mamba_n_groups": SIZE, "mamba_d_state": SIZE,
         "mamba_d_conv": SIZE, "mamba_expand": SIZE, "mamba_conv_bias": FLAG, "mamba_proj_bias": FLAG,
         "mamba_norm_before_gate": FLAG, "mamba_rms_norm": FLAG, "time_step_limit": nullable(STEP_LIMIT),
         "projectors_bias": FLAG, "rope_parameters": nullable(MAPPING), "rope_theta": POSITIVE,
         "lm_head_multiplier": NUMBER, "embedding_multiplier": NUMBER, "mlp_multipliers": nullable(NUMBERS),
         "key_multiplier": NUMBER, "attention_out_multiplier": NUMBER, "attention_in_multiplier": NUMBER,
         "ssm_multipliers": nullable(NUMBERS), "ssm_in_multiplier": NUMBER, "ssm_out_multiplier": NUMBER,
         "attention_bias": FLAG, "mlp_bias": FLAG, "model_type": NAME, "layers_block_type": nullable(NAMES),
         "layer_types": nullable(NAMES)}
"""Every key the loader reads, with the kind of value it takes (:mod:`.config_values`)."""
_HARMLESS = HARMLESS | {"num_logits_to_keep", "time_step_min", "time_step_max", "time_step_floor",
                        "mamba_chunk_size"}  # (a kernel's tile: attnkit scans by SSD_CHUNK, the same numbers to rounding)
_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")


def falcon_h1_config_from_hf(hf: dict) -> FalconH1Config:
    """attnkit's config from a transformers Falcon-H1 ``config.json``: every key read, harmless in evaluation, or
    refused by name (:class:`UnsupportedConfigError`)."""
    checked_keys(hf, ("falcon_h1",), _READ, _HARMLESS, _REQUIRED)
    if hf.get("hidden_act", "silu") != "silu":
        raise UnsupportedConfigError(f"falcon_h1 config: attnkit implements hidden_act 'silu', got {hf['hidden_act']!r}")
    rope = hf.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise UnsupportedConfigError(f"falcon_h1 config: attnkit implements rope_type 'default', got "
                                     f"{rope['rope_type']!r}")
    layers, d_model, heads = hf["num_hidden_layers"], hf["hidden_size"], hf["num_attention_heads"]
    types = hf.get("layers_block_type") or hf.get("layer_types")
    if types is not None and set(types) != {PARALLEL}:
        raise UnsupportedConfigError(f"falcon_h1 config: every layer is Mamba-2 and attention side by side "
                                     f"('hybrid'), got layer types {sorted(set(types))}")
    inner = hf.get("mamba_d_ssm") or int(hf.get("mamba_expand", 2) * d_model)
    mamba_heads, mamba_head_dim = mamba_heads_from_hf(
        hf, "falcon_h1", inner, f"the mixer's width {inner} (mamba_d_ssm, else mamba_expand x hidden_size)")
    dt_limit = dt_limit_from_hf(hf, "falcon_h1")
    mlp = tuple(float(m) for m in hf.get("mlp_multipliers") or (1.0, 1.0))
    ssm = tuple(float(m) for m in hf.get("ssm_multipliers") or (1.0,) * 5)
    if len(mlp) != 2 or len(ssm) != 5:
        raise UnsupportedConfigError(f"falcon_h1 config: mlp_multipliers must hold 2 factors and ssm_multipliers 5, "
                                     f"got {list(mlp)} and {list(ssm)}")
    return FalconH1Config(
        vocab_size=hf["vocab_size"], d_model=d_model, num_layers=layers, num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads, head_dim=hf.get("head_dim") or d_model // heads,
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        attention_bias=bool(hf.get("attention_bias", False)), mamba_heads=mamba_heads, mamba_head_dim=mamba_head_dim,
        state_size=hf.get("mamba_d_state", 256), n_groups=hf.get("mamba_n_groups", 1),
        conv_kernel=hf.get("mamba_d_conv", 4), conv_bias=bool(hf.get("mamba_conv_bias", True)),
        proj_bias=bool(hf.get("mamba_proj_bias", False)), projectors_bias=bool(hf.get("projectors_bias", False)),
        chunk_size=SSD_CHUNK, dt_limit=dt_limit,
        mamba_rms_norm=bool(hf.get("mamba_rms_norm", False)),
        mamba_norm_before_gate=bool(hf.get("mamba_norm_before_gate", True)), d_ff=hf.get("intermediate_size", 14336),
        mlp_bias=bool(hf.get("mlp_bias", False)), embedding_multiplier=float(hf.get("embedding_multiplier", 1.0)),
        lm_head_multiplier=float(hf.get("lm_head_multiplier", 1.0)), mlp_multipliers=(mlp[0], mlp[1]),
        key_multiplier=float(hf.get("key_multiplier", 1.0)),
        attention_in_multiplier=float(hf.get("attention_in_multiplier", 1.0)),
        attention_out_multiplier=float(hf.get("attention_out_multiplier", 1.0)), ssm_multipliers=ssm,
        ssm_in_multiplier=float(hf.get("ssm_in_multiplier", 1.0)),
        ssm_out_multiplier=float(hf.get("ssm_out_multiplier", 1.0)), norm_eps=hf.get("rms_norm_eps", 1e-5),
        tie_embeddings=bool(hf.get("tie_word_embeddings")), max_len=hf.get("max_position_embeddings", 8192))


def _attnkit_name(name: str) -> str:
    name = name.removeprefix("model.").replace(".self_attn.o_proj.", ".self_attn.out_proj.")
    return "norm.weight" if name == "final_layernorm.weight" else name


def load_checkpoint_folder(folder: str | os.PathLike, *, dtype: torch.dtype | None = None) -> FalconH1LM:
    """A :class:`FalconH1LM` from a transformers Falcon-H1 checkpoint folder (``config.json`` and safetensors), in
    eval mode; every tensor must find its place and every parameter a tensor. Loading never runs code."""
    return load_native_folder(folder, config_from_hf=falcon_h1_config_from_hf, build=FalconH1LM, dtype=dtype,
                              embedding=("model.embed_tokens.weight",),
                              state=lambda tensors, _: {_attnkit_name(n): t for n, t in tensors.items()})
