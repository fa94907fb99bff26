"""What a hybrid of linear and softmax attention holds while it decodes, against an all-softmax model of the
same depth: the softmax layers' KV cache grows with the context, the linear layers' state does not.

A hybrid's decoding memory at n tokens is ``n x kv_bytes_per_token + state_bytes``: the KV cache of its softmax
layers, plus a constant per sequence, each linear layer's recurrent state (H x K x V numbers, kept in float32
as the models keep it) and its short convolution's last (kernel - 1) inputs. The same model with every layer
softmax would hold ``n x all_softmax_bytes_per_token``; the hybrid holds less from ``crossover`` tokens on.

    from attnkit.cost import HYBRID_PRESETS, hybrid_memory
    memory = hybrid_memory(HYBRID_PRESETS["qwen3-next-80b-a3b"], seq=65536, dtype_bytes=2)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HybridShape", "HybridMemory", "HYBRID_PRESETS", "HYBRID_MODEL_TYPES", "hybrid_memory", "shape_from_hf"]

STATE_BYTES = 4
"""The linear layers' recurrent state is float32 whatever the model's dtype (flash-linear-attention, transformers)."""


@dataclass(frozen=True)
class HybridShape:
    """The memory-relevant shape of a hybrid model: its softmax layers' cache per token and layer
    (``full_numbers_per_token``: 2 x KV heads x head dim for GQA; the latent for MLA), its linear layers' state
    (``linear_heads`` x ``linear_k_dim`` x ``linear_v_dim``) and convolution (``conv_channels`` inputs kept
    (``conv_kernel`` - 1) tokens). A Mamba-2 layer is a linear one: its state is heads x state size x head dim, its
    convolution runs over x, B and C. Layers that mix no tokens (Nemotron-H's MLP and expert layers) are not
    counted."""

    name: str
    full_layers: int
    linear_layers: int
    full_numbers_per_token: int
    full_kind: str  # what the softmax layers cache
    linear_heads: int
    linear_k_dim: int
    linear_v_dim: int
    conv_channels: int
    conv_kernel: int
    source: str  # where the sizes come from
    parallel: bool = False  # each layer holds both (Falcon-H1): the same depth all softmax has full_layers layers


HYBRID_PRESETS = {
    "qwen3-next-80b-a3b": HybridShape(
        "Qwen3-Next-80B-A3B", full_layers=12, linear_layers=36, full_numbers_per_token=2 * 2 * 256,
        full_kind="gated attention, 2 KV heads of 256", linear_heads=32, linear_k_dim=128, linear_v_dim=128,
        conv_channels=2 * 16 * 128 + 32 * 128, conv_kernel=4,
        source="transformers' Qwen3NextConfig defaults (Qwen/Qwen3-Next-80B-A3B-Instruct): 48 layers, every 4th full "
               "attention, 16 heads with 2 KV heads of 256; Gated DeltaNet 16 key and 32 value heads of 128, conv kernel 4"),
    "kimi-linear-48b-a3b": HybridShape(
        "Kimi-Linear-48B-A3B", full_layers=6, linear_layers=21, full_numbers_per_token=512 + 64,
        full_kind="MLA latent, 512 + 64 rotary", linear_heads=32, linear_k_dim=128, linear_v_dim=128,
        conv_channels=3 * 32 * 128, conv_kernel=4,
        source="transformers' KimiLinearConfig defaults (moonshotai/Kimi-Linear-48B-A3B-Instruct): 27 layers, MLA on "
               "layers 5, 9, ..., 25 (kv_lora_rank 512, qk_rope 64); KDA 32 heads of 128, short convolutions of 4 on "
               "q, k and v"),
    "granite-4.0-h-micro": HybridShape(
        "Granite-4.0-H-Micro", full_layers=4, linear_layers=36, full_numbers_per_token=2 * 8 * 64,
        full_kind="softmax attention without position embedding, 8 KV heads of 64", linear_heads=64,
        linear_k_dim=128, linear_v_dim=64, conv_channels=64 * 64 + 2 * 1 * 128, conv_kernel=4,
        source="ibm-granite/granite-4.0-h-micro's config.json: 40 layers, attention at 5, 15, 25 and 35 (32 heads, 8 KV "
               "heads of 2048 / 32 = 64); Mamba-2 with 64 heads of 64, state 128, 1 group, conv kernel 4"),
    "nemotron-h-8b": HybridShape(
        "Nemotron-H-8B", full_layers=4, linear_layers=24, full_numbers_per_token=2 * 8 * 128,
        full_kind="softmax attention without position embedding, 8 KV heads of 128", linear_heads=128,
        linear_k_dim=128, linear_v_dim=64, conv_channels=128 * 64 + 2 * 8 * 128, conv_kernel=4,
        source="transformers' NemotronHConfig defaults, nvidia/Nemotron-H-8B-Base-8K's sizes, with its pattern "
               "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M- (24 Mamba-2, 4 attention, 24 MLP layers): "
               "32 heads with 8 KV heads of 128; Mamba-2 with 128 heads of 64, state 128, 8 groups, conv kernel 4"),
}
"""The hybrids `attnkit cost` knows by name."""


@dataclass(frozen=True)
class HybridMemory:
    kv_bytes_per_token: int  # the softmax layers' cache, all of them, one token
    state_bytes: int  # per sequence, constant: every linear layer's recurrent state and convolution tail
    recurrent_state_bytes: int
    conv_state_bytes: int
    all_softmax_bytes_per_token: int  # the same depth with every layer softmax (its own kind of cache)
    crossover: int  # the context from which the hybrid holds less than the all-softmax model
    total_bytes: int  # the hybrid at ``seq`` tokens
    all_softmax_total_bytes: int


def hybrid_memory(shape: HybridShape, seq: int, dtype_bytes: int) -> HybridMemory:
    """Decoding memory of one sequence of ``seq`` tokens (module docstring)."""
    kv = shape.full_layers * shape.full_numbers_per_token * dtype_bytes
    recurrent = shape.linear_layers * shape.linear_heads * shape.linear_k_dim * shape.linear_v_dim * STATE_BYTES
    conv = shape.linear_layers * (shape.conv_kernel - 1) * shape.conv_channels * dtype_bytes
    depth = shape.full_layers if shape.parallel else shape.full_layers + shape.linear_layers
    everything = depth * shape.full_numbers_per_token * dtype_bytes  # (0 for a model with no attention to compare)
    state = recurrent + conv
    crossover = state // (everything - kv) + 1 if everything > kv else 0  # the first n with n kv + state < n all
    return HybridMemory(kv, state, recurrent, conv, everything, crossover, seq * kv + state, seq * everything)


HYBRID_MODEL_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "kimi_linear", "minimax", "bamba",
                      "granitemoehybrid", "nemotron_h", "falcon_h1", "mamba2")
"""The transformers ``model_type`` values whose ``config.json`` :func:`shape_from_hf` reads."""


def shape_from_hf(hf: dict, name: str = "config.json") -> HybridShape:
    """The :class:`HybridShape` of a transformers hybrid's ``config.json`` (a model type of
    :data:`HYBRID_MODEL_TYPES`), read by attnkit's own loaders' config readers (every key read, harmless, or refused
    by name: :class:`attnkit.models.hf_config.UnsupportedConfigError`)."""
    from ..models.hybrid import LINEAR

    kind = hf.get("model_type") if isinstance(hf, dict) else None
    if kind in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"):
        from ..models.qwen3_next import qwen3_next_config_from_hf

        c = qwen3_next_config_from_hf(hf)
        linear = sum(t == LINEAR for t in c.layer_types)
        return HybridShape(
            name, full_layers=len(c.layer_types) - linear, linear_layers=linear,
            full_numbers_per_token=2 * c.num_kv_heads * c.head_dim,
            full_kind=f"gated attention, {c.num_kv_heads} KV heads of {c.head_dim}", linear_heads=c.linear_num_value_heads,
            linear_k_dim=c.linear_key_head_dim, linear_v_dim=c.linear_value_head_dim,
            conv_channels=2 * c.linear_num_key_heads * c.linear_key_head_dim
            + c.linear_num_value_heads * c.linear_value_head_dim, conv_kernel=c.conv_kernel, source=name)
    if kind == "kimi_linear":
        from ..models.kimi_linear import kimi_linear_config_from_hf

        k = kimi_linear_config_from_hf(hf)
        linear = sum(t == LINEAR for t in k.layer_types)
        return HybridShape(
            name, full_layers=len(k.layer_types) - linear, linear_layers=linear,
            full_numbers_per_token=k.kv_lora_rank + k.qk_rope_head_dim,
            full_kind=f"MLA latent, {k.kv_lora_rank} + {k.qk_rope_head_dim} rotary", linear_heads=k.linear_num_heads,
            linear_k_dim=k.linear_head_dim, linear_v_dim=k.linear_head_dim,
            conv_channels=3 * k.linear_num_heads * k.linear_head_dim, conv_kernel=k.conv_kernel, source=name)
    if kind == "minimax":
        from ..models.minimax import minimax_config_from_hf

        m = minimax_config_from_hf(hf)
        if m.window is not None:
            raise ValueError(f"{name}: a sliding window on the softmax layers (sliding_window={m.window}) keeps a "
                             "rolling cache this count does not model")
        linear = sum(t == LINEAR for t in m.layer_types)
        return HybridShape(
            name, full_layers=len(m.layer_types) - linear, linear_layers=linear,
            full_numbers_per_token=2 * m.num_kv_heads * m.head_dim,
            full_kind=f"softmax attention, {m.num_kv_heads} KV heads of {m.head_dim}", linear_heads=m.num_heads,
            linear_k_dim=m.head_dim, linear_v_dim=m.head_dim, conv_channels=0, conv_kernel=1, source=name)
    if kind in ("bamba", "granitemoehybrid", "nemotron_h"):
        from ..models.granite import granite_hybrid_config_from_hf
        from ..models.nemotron_h import nemotron_h_config_from_hf

        s = nemotron_h_config_from_hf(hf) if kind == "nemotron_h" else granite_hybrid_config_from_hf(hf)
        linear = sum(t == LINEAR for t in s.layer_types)
        full = sum(t == "full_attention" for t in s.layer_types)
        position = "" if getattr(s, "rotary_dim", 0) else " without position embedding"
        return HybridShape(
            name, full_layers=full, linear_layers=linear, full_numbers_per_token=2 * s.num_kv_heads * s.head_dim,
            full_kind=f"softmax attention{position}, {s.num_kv_heads} KV heads of {s.head_dim}",
            linear_heads=s.mamba_heads, linear_k_dim=s.state_size, linear_v_dim=s.mamba_head_dim,
            conv_channels=s.mamba_heads * s.mamba_head_dim + 2 * s.n_groups * s.state_size,
            conv_kernel=s.conv_kernel, source=name)
    if kind == "falcon_h1":  # Mamba-2 and attention side by side in every layer
        from ..models.falcon_h1 import falcon_h1_config_from_hf

        f = falcon_h1_config_from_hf(hf)
        return HybridShape(
            name, full_layers=f.num_layers, linear_layers=f.num_layers,
            full_numbers_per_token=2 * f.num_kv_heads * f.head_dim,
            full_kind=f"softmax attention beside Mamba-2 in every layer, {f.num_kv_heads} KV heads of {f.head_dim}",
            linear_heads=f.mamba_heads, linear_k_dim=f.state_size, linear_v_dim=f.mamba_head_dim,
            conv_channels=f.mamba_heads * f.mamba_head_dim + 2 * f.n_groups * f.state_size,
            conv_kernel=f.conv_kernel, source=name, parallel=True)
    if kind == "mamba2":  # no attention at all: nothing grows with the context
        from ..models.mamba2 import mamba2_config_from_hf

        m2 = mamba2_config_from_hf(hf)
        return HybridShape(
            name, full_layers=0, linear_layers=m2.num_layers, full_numbers_per_token=0, full_kind="none",
            linear_heads=m2.num_heads, linear_k_dim=m2.state_size, linear_v_dim=m2.head_dim,
            conv_channels=m2.num_heads * m2.head_dim + 2 * m2.n_groups * m2.state_size, conv_kernel=m2.conv_kernel,
            source=name)
    raise ValueError(f"{name}: model_type {kind!r} is not a hybrid attnkit counts ({', '.join(HYBRID_MODEL_TYPES)})")
