"""Qwen3-Next as an attnkit decoder: three Gated DeltaNet layers for every gated-attention layer
(``layer_types``), each followed by a mixture of experts with a gated shared expert.

    x = embed(ids)
    for each layer:  x = x + mixer(RMSNorm(x));  x = x + MoE(RMSNorm(x))      (zero-centred RMSNorms, 1 + w)
        mixer: GatedDeltaNet (linear_attention) or GatedAttention (full_attention, partial RoPE, q/k norms)
        MoE: softmax router, top-k experts (SwiGLU), + sigmoid(x w) * shared expert
    logits = lm_head(RMSNorm(x))

Module names follow transformers' (``embed_tokens``, ``layers.i.linear_attn`` / ``self_attn``, ``mlp.gate``,
``mlp.experts``, ``mlp.shared_expert``, ...), so a checkpoint's tensors find their places by name
(:func:`load_checkpoint_folder`, reached through :func:`attnkit.models.pretrained.load_hf_folder`). The cache is one
:class:`~attnkit.layers.KVCache` per softmax layer and one constant-size
:class:`~attnkit.layers.LinearStateCache` per linear layer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..layers import GatedAttention, GatedDeltaNet, RotaryEmbedding
from ..layers.calls import called, project_by_name
from ..layers.gated import ZeroCentredRMSNorm
from .blocks import Experts, GatedFeedForward, normalised, softmax_top_k
from .config_values import COUNT, FLAG, INDICES, MAPPING, NAME, NAMES, NON_NEGATIVE, POSITIVE, SIZE, nullable
from .hf_config import UnsupportedConfigError
from .hybrid import HARMLESS, LINEAR, HybridLM, checked_keys, mix
from .weights import fused_experts, load_native_folder

__all__ = ["Qwen3NextConfig", "Qwen3NextLM", "qwen3_next_config_from_hf", "load_checkpoint_folder"]


@dataclass(frozen=True)
class Qwen3NextConfig:
    """The sizes of a Qwen3-Next model (transformers' ``Qwen3NextConfig`` keys, attnkit's names)."""

    vocab_size: int
    d_model: int
    layer_types: tuple[str, ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    conv_kernel: int
    d_ff: int  # a dense MLP's width (layers without experts)
    num_experts: int
    experts_per_token: int
    moe_d_ff: int
    shared_d_ff: int
    norm_topk_prob: bool
    sparse_layers: tuple[bool, ...]
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    max_len: int = 262144  # the context the model was trained for (max_position_embeddings): generation's bound


class SparseMoE(nn.Module):
    """Qwen3-Next's mixture of experts: a softmax router (float32), the top-k experts (SwiGLU, weights stored as
    transformers' fused ``gate_up_proj`` (E, 2 I, D) and ``down_proj`` (E, D, I)), normalised top-k
    probabilities where the config says so, plus a shared expert scaled by a sigmoid gate."""

    def __init__(self, c: Qwen3NextConfig):
        super().__init__()
        self.top_k, self.norm_topk_prob = c.experts_per_token, c.norm_topk_prob
        self.gate = nn.Linear(c.d_model, c.num_experts, bias=False)
        self.experts = Experts(c.num_experts, c.d_model, c.moe_d_ff)
        self.shared_expert = GatedFeedForward(c.d_model, c.shared_d_ff)
        self.shared_expert_gate = nn.Linear(c.d_model, 1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        parts: dict[str, nn.Module] = self._modules  # type: ignore[assignment]  # (called, project_by_name)
        chosen, top = softmax_top_k(project_by_name(self, "gate", flat), self.top_k, self.norm_topk_prob)
        routed = called(parts["experts"])(flat, chosen, top.to(x.dtype))
        shared = torch.sigmoid(project_by_name(self, "shared_expert_gate", flat)) * called(parts["shared_expert"])(flat)
        return (routed + shared).reshape(shape)


class Qwen3NextBlock(nn.Module):
    """One layer: the token mixer (linear or full attention) and the MLP, each after its zero-centred RMSNorm."""

    def __init__(self, c: Qwen3NextConfig, layer: int, rotary: RotaryEmbedding):
        super().__init__()
        self.kind = c.layer_types[layer]
        self.input_layernorm = ZeroCentredRMSNorm(c.d_model, eps=c.norm_eps)
        if self.kind == LINEAR:
            self.linear_attn = GatedDeltaNet(c.d_model, c.linear_num_key_heads, c.linear_num_value_heads,
                                             c.linear_key_head_dim, c.linear_value_head_dim, conv_kernel=c.conv_kernel,
                                             norm_eps=c.norm_eps)
        else:
            self.self_attn = GatedAttention(c.d_model, c.num_heads, c.num_kv_heads, head_dim=c.head_dim, bias=False,
                                            norm_eps=c.norm_eps, rotary=rotary)
        self.post_attention_layernorm = ZeroCentredRMSNorm(c.d_model, eps=c.norm_eps)
        self.mlp: nn.Module = SparseMoE(c) if c.sparse_layers[layer] else GatedFeedForward(c.d_model, c.d_ff)

    def forward(self, x: Tensor, *, key_mask: Tensor | None, positions: Tensor | None, cache,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        parts: dict[str, nn.Module] = self._modules  # type: ignore[assignment]  # (__getattr__: 1 us a read)
        mixer = parts["linear_attn"] if self.kind == LINEAR else parts["self_attn"]
        mixed, weights = mix(mixer, self.kind, normalised(parts["input_layernorm"], x), key_mask=key_mask,
                             positions=positions, cache=cache, need_weights=need_weights)
        x = x + mixed
        return x + called(parts["mlp"])(normalised(parts["post_attention_layernorm"], x)), weights


class Qwen3NextLM(HybridLM):
    """Qwen3-Next's decoder (module docstring): ``forward(input_ids, attention_mask, cache=, position_ids=)``
    -> :class:`LMOutput` as attnkit's other decoders (:class:`~attnkit.models.hybrid.HybridLM`), so
    :func:`attnkit.decoding.generate` drives it."""

    def __init__(self, config: Qwen3NextConfig):
        super().__init__()
        c = self.config = config
        rotary = RotaryEmbedding(c.head_dim, c.rope_theta, rotary_dim=c.rotary_dim)
        self.embed_tokens = nn.Embedding(c.vocab_size, c.d_model)
        self.layers = nn.ModuleList(Qwen3NextBlock(c, i, rotary) for i in range(len(c.layer_types)))
        self.norm = ZeroCentredRMSNorm(c.d_model, eps=c.norm_eps)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.embed_tokens(input_ids)


# --------------------------------------------------------------------------- transformers checkpoints
_READ = {"vocab_size": SIZE, "hidden_size": SIZE, "num_hidden_layers": SIZE, "layer_types": nullable(NAMES),
         "num_attention_heads": SIZE, "num_key_value_heads": SIZE, "head_dim": nullable(SIZE),
         "partial_rotary_factor": POSITIVE, "rope_parameters": nullable(MAPPING), "rope_theta": POSITIVE,
         "linear_num_key_heads": SIZE, "linear_num_value_heads": SIZE, "linear_key_head_dim": SIZE,
         "linear_value_head_dim": SIZE, "linear_conv_kernel_dim": SIZE, "intermediate_size": COUNT,
         "num_experts": COUNT, "num_experts_per_tok": SIZE, "moe_intermediate_size": COUNT,
         "shared_expert_intermediate_size": COUNT, "norm_topk_prob": FLAG, "decoder_sparse_step": SIZE,
         "mlp_only_layers": nullable(INDICES), "rms_norm_eps": NON_NEGATIVE, "tie_word_embeddings": nullable(FLAG),
         "hidden_act": NAME, "attention_bias": FLAG, "model_type": NAME, "full_attention_interval": SIZE,
         "max_position_embeddings": SIZE}
"""Every key the loader reads, with the kind of value it takes (:mod:`.config_values`)."""
_HARMLESS = HARMLESS | {"add_cross_attention", "bad_words_ids", "cross_attention_hidden_size", "num_beams"}


MODEL_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
"""The transformers model types this decoder is: Qwen3-Next, and Qwen3.5's text models (dense and mixture of
experts), which differ from it only in how their checkpoints store the Gated DeltaNet projections (four
separate ones, :func:`_fused_projections`) and in having no dense layers between expert layers (or no experts)."""


_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")


def qwen3_next_config_from_hf(hf: dict) -> Qwen3NextConfig:
    """attnkit's config from a transformers Qwen3-Next or Qwen3.5 text ``config.json``: every key read, harmless in
    evaluation, or refused by name (:class:`UnsupportedConfigError`). Qwen3.5's mixture of experts renormalises its
    chosen experts' probabilities whatever ``norm_topk_prob`` says, as transformers' does (its config has no such
    setting)."""
    kind = checked_keys(hf, MODEL_TYPES, _READ, _HARMLESS, _REQUIRED)
    if hf.get("hidden_act", "silu") != "silu" or hf.get("attention_bias", False):
        raise UnsupportedConfigError(f"{kind} config: attnkit implements hidden_act 'silu' without attention biases, "
                                     f"got {hf.get('hidden_act')!r}, attention_bias={hf.get('attention_bias')!r}")
    rope = hf.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise UnsupportedConfigError(f"{kind} config: attnkit implements rope_type 'default', got {rope['rope_type']!r}")
    layers = hf["num_hidden_layers"]
    types = tuple(hf.get("layer_types") or ["full_attention" if (i + 1) % hf.get("full_attention_interval", 4) == 0
                                            else "linear_attention" for i in range(layers)])
    step, only = hf.get("decoder_sparse_step", 1), set(hf.get("mlp_only_layers") or [])
    sparse = tuple(i not in only and hf.get("num_experts", 0) > 0 and (i + 1) % step == 0 for i in range(layers))
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    factor = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25))
    if int(head_dim * factor) % 2:  # (transformers rotates the even number above it with the odd one's frequencies)
        raise UnsupportedConfigError(f"{kind} config: head_dim x partial_rotary_factor = {head_dim} x {factor} gives "
                                     f"{int(head_dim * factor)} rotary dims; attnkit rotates an even number of dims "
                                     "(pairs)")
    return Qwen3NextConfig(
        vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], layer_types=types, num_heads=hf["num_attention_heads"],
        num_kv_heads=hf["num_key_value_heads"], head_dim=head_dim, rotary_dim=int(head_dim * factor),
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        linear_num_key_heads=hf["linear_num_key_heads"], linear_num_value_heads=hf["linear_num_value_heads"],
        linear_key_head_dim=hf["linear_key_head_dim"], linear_value_head_dim=hf["linear_value_head_dim"],
        conv_kernel=hf.get("linear_conv_kernel_dim", 4), d_ff=hf.get("intermediate_size", 0), num_experts=hf.get("num_experts", 0),
        experts_per_token=hf.get("num_experts_per_tok", 1), moe_d_ff=hf.get("moe_intermediate_size", 0),
        shared_d_ff=hf.get("shared_expert_intermediate_size", 0), norm_topk_prob=kind == "qwen3_5_moe_text" or bool(hf.get("norm_topk_prob", True)),
        sparse_layers=sparse, norm_eps=hf.get("rms_norm_eps", 1e-6), tie_embeddings=bool(hf.get("tie_word_embeddings")),
        max_len=hf.get("max_position_embeddings", 262144))


def _fused_projections(tensors: dict[str, Tensor], c: Qwen3NextConfig) -> dict[str, Tensor]:
    """Qwen3.5's four Gated DeltaNet input projections (``in_proj_qkv``: all queries, then keys, then values;
    ``in_proj_z``; ``in_proj_b``; ``in_proj_a``) as Qwen3-Next's two, grouped per key head (``in_proj_qkvz``: q, k,
    the values and the gates of the value heads reading key head 0, then of key head 1, ...; ``in_proj_ba``
    likewise): the same rows, reordered, so one layer serves both (value head j reads key head j // group in
    both). A checkpoint with Qwen3-Next's fused projections is returned as it is."""
    Hk, group = c.linear_num_key_heads, c.linear_num_value_heads // c.linear_num_key_heads
    K, V = c.linear_key_head_dim, c.linear_value_head_dim
    out = dict(tensors)
    for name in [n for n in tensors if n.endswith(".linear_attn.in_proj_qkv.weight")]:
        prefix = name.removesuffix("in_proj_qkv.weight")
        q, k, v = out.pop(name).split([Hk * K, Hk * K, Hk * group * V])
        z, b, a = (out.pop(prefix + part + ".weight") for part in ("in_proj_z", "in_proj_b", "in_proj_a"))
        per_head = [torch.cat([q.view(Hk, K, -1)[h], k.view(Hk, K, -1)[h], v.view(Hk, group * V, -1)[h],
                               z.view(Hk, group * V, -1)[h]]) for h in range(Hk)]
        out[prefix + "in_proj_qkvz.weight"] = torch.cat(per_head)
        out[prefix + "in_proj_ba.weight"] = torch.cat([torch.cat([b.view(Hk, group, -1)[h], a.view(Hk, group, -1)[h]])
                                                       for h in range(Hk)])
    return out


def _state(tensors: dict[str, Tensor], config: Qwen3NextConfig) -> dict[str, Tensor]:
    """attnkit's state dict from a checkpoint's tensors: ``model.`` dropped, ``o_proj`` as ``out_proj``, Qwen3.5's
    projections fused as Qwen3-Next's, experts saved one by one stacked into the fused layout."""
    renamed = {name.removeprefix("model.").replace(".self_attn.o_proj.", ".self_attn.out_proj."): tensor
               for name, tensor in tensors.items()}
    return fused_experts(_fused_projections(renamed, config), prefix_parts=2)


def load_checkpoint_folder(folder: str | os.PathLike, *, dtype: torch.dtype | None = None) -> Qwen3NextLM:
    """A :class:`Qwen3NextLM` from a transformers Qwen3-Next or Qwen3.5 text checkpoint folder (``config.json`` and safetensors), in
    eval mode; every tensor must find its place and every parameter a tensor. Loading never runs code."""
    return load_native_folder(folder, config_from_hf=qwen3_next_config_from_hf, build=Qwen3NextLM, dtype=dtype,
                              embedding=("model.embed_tokens.weight",), state=_state)
