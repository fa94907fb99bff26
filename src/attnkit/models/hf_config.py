"""Hugging Face ``config.json`` -> attnkit config (BERT, GPT-2, Llama, Mistral, Qwen2): every key is
implemented, known not to change a base model's numbers in evaluation, or refused by name with
:class:`UnsupportedConfigError`. Never a silent difference."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .config import DecoderConfig, EncoderConfig
from .config_values import COUNT, NON_NEGATIVE, POSITIVE, SIZE, UnsupportedConfigError, checked_values, nullable

__all__ = ["MODEL_TYPES", "HF_ACTIVATIONS", "UnsupportedConfigError", "config_from_hf", "deepseek_config_from_hf",
           "means_none"]

MODEL_TYPES = ("bert", "gpt2", "llama", "mistral", "qwen2")
"""Hugging Face ``model_type`` values :func:`config_from_hf` reads."""

# Hugging Face activation names -> attnkit's (see ACTIVATION_NAMES).
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_python": "gelu", "relu": "relu", "gelu_new": "gelu_tanh",
                  "gelu_pytorch_tanh": "gelu_tanh", "silu": "silu", "swish": "silu"}

# Config keys that do not change the numbers of a base model in evaluation: bookkeeping, token ids,
# initialisation, dropout (0 in evaluation), caching, output switches.
_HARMLESS_ANY = frozenset({
    "transformers_version", "architectures", "output_hidden_states", "output_attentions", "return_dict", "dtype",
    "torch_dtype", "chunk_size_feed_forward", "id2label", "label2id", "problem_type", "_name_or_path", "model_type",
    "is_encoder_decoder", "use_cache", "initializer_range", "pad_token_id", "bos_token_id", "eos_token_id",
    "sep_token_id", "decoder_start_token_id", "gradient_checkpointing", "_attn_implementation_autoset",
    "finetuning_task", "prefix", "task_specific_params", "tokenizer_class", "num_labels", "classifier_dropout",
    "max_length", "min_length", "do_sample", "num_beams", "temperature", "top_k", "top_p", "repetition_penalty",
})
_HARMLESS = {
    "bert": _HARMLESS_ANY | {"hidden_dropout_prob", "attention_probs_dropout_prob", "tie_word_embeddings"},
    "gpt2": _HARMLESS_ANY | {"resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_type", "summary_use_proj",
                             "summary_activation", "summary_proj_to_labels", "summary_first_dropout", "n_ctx",
                             # upcasting to float32 before the softmax: attnkit computes scores in float32 anyway
                             "reorder_and_upcast_attn"},
    # max_position_embeddings: RoPE has no table; pretraining_tp: not used by transformers 5's Llama.
    "llama": _HARMLESS_ANY | {"attention_dropout", "pretraining_tp", "max_position_embeddings"},
}
_HARMLESS["mistral"] = _HARMLESS["qwen2"] = _HARMLESS["llama"]
_IMPLEMENTED = {
    "bert": {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
             "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "hidden_act", "position_embedding_type",
             "is_decoder", "add_cross_attention"},
    "gpt2": {"vocab_size", "n_embd", "n_layer", "n_head", "n_inner", "n_positions", "layer_norm_epsilon",
             "activation_function", "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "add_cross_attention",
             "tie_word_embeddings"},
    "llama": {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "hidden_act", "rms_norm_eps", "tie_word_embeddings", "rope_parameters",
              "rope_scaling", "rope_theta", "attention_bias", "mlp_bias", "head_dim"},
}
_IMPLEMENTED["mistral"] = _IMPLEMENTED["llama"] | {"sliding_window"}
_IMPLEMENTED["qwen2"] = _IMPLEMENTED["llama"] - {"attention_bias", "mlp_bias"} | {
    "sliding_window", "use_sliding_window", "max_window_layers", "layer_types"}
# Sub-keys of rope_parameters per rope_type.
_ROPE_KEYS = {"default": {"rope_type", "type", "rope_theta"},
              "linear": {"rope_type", "type", "rope_theta", "factor"},
              "llama3": {"rope_type", "type", "rope_theta", "factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings"}}


def _refuse(kind: str, key: str, value, supported: str) -> UnsupportedConfigError:
    return UnsupportedConfigError(f"{kind} config: {key}={value!r} is not supported; supported: {supported}")


def means_none(key: str, value) -> bool:
    """Whether a config key's value says the feature is absent: null (transformers 4.x writes ``rope_scaling: null``
    and the like), or false for a ``use_*`` switch (``use_sliding_window: false``). Such a key asks for nothing
    attnkit lacks, so a loader that does not read it takes it."""
    return value is None or (value is False and key.startswith("use_"))


def _check_keys(hf: Mapping, kind: str, ignore: Iterable[str]) -> None:
    known = _IMPLEMENTED[kind] | _HARMLESS[kind] | set(ignore)
    unknown = sorted(key for key in set(hf) - known if not means_none(key, hf[key]))
    if unknown:
        raise UnsupportedConfigError(
            f"{kind} config: unknown keys {unknown}; attnkit implements {sorted(_IMPLEMENTED[kind])} and ignores "
            f"only keys known not to change the numbers. If these are harmless for your checkpoint, pass "
            f"config_from_hf(..., ignore={unknown!r})"
        )


def _require(hf: Mapping, kind: str, key: str, expected, supported: str) -> None:
    if hf.get(key) not in (expected, None):
        raise _refuse(kind, key, hf[key], supported)


def _activation(hf: Mapping, kind: str, key: str, default: str) -> str:
    value = hf.get(key, default)
    if value not in HF_ACTIVATIONS:
        raise _refuse(kind, key, value, ", ".join(sorted(HF_ACTIVATIONS)))
    return HF_ACTIVATIONS[value]


def _rope(hf: Mapping, kind: str) -> dict:
    """DecoderConfig RoPE fields from rope_parameters (transformers 5) or rope_theta / rope_scaling (4.x)."""
    legacy = hf.get("rope_scaling") or {}
    params = {**legacy, **(hf.get("rope_parameters") or {})}
    rope_type = params.get("rope_type", params.get("type", "default"))
    key = "rope_parameters" if hf.get("rope_parameters") else "rope_scaling"
    if rope_type not in _ROPE_KEYS:
        raise _refuse(kind, f"{key}['rope_type']", rope_type, ", ".join(_ROPE_KEYS))
    for name in sorted(set(params) - _ROPE_KEYS[rope_type]):
        raise _refuse(kind, f"{key}[{name!r}]", params[name],
                      f"for rope_type {rope_type!r} only {sorted(_ROPE_KEYS[rope_type] - {'type'})}")
    fields = {"rope_base": float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))}
    if rope_type != "default":
        fields |= {"rope_scaling": rope_type, "rope_factor": float(params.get("factor", 1.0))}
    if rope_type == "llama3":
        fields |= {"rope_low_freq_factor": float(params["low_freq_factor"]),
                   "rope_high_freq_factor": float(params["high_freq_factor"]),
                   "rope_original_max_len": int(params["original_max_position_embeddings"])}
    return fields


def _windows(hf: Mapping, kind: str) -> dict:
    """window / window_layers: Mistral's sliding_window on every layer; Qwen2's per layer_types."""
    if kind == "mistral":
        return {"window": hf.get("sliding_window")}
    if kind != "qwen2":
        return {}
    layer_types = hf.get("layer_types")
    if layer_types is None:  # transformers 4.x: sliding from layer max_window_layers on, when enabled
        if not hf.get("use_sliding_window") or not hf.get("sliding_window"):
            return {}
        layer_types = ["sliding_attention" if i >= hf.get("max_window_layers", 0) else "full_attention"
                       for i in range(hf["num_hidden_layers"])]
    bad = sorted({t for t in layer_types} - {"full_attention", "sliding_attention"})
    if bad or len(layer_types) != hf["num_hidden_layers"]:
        raise _refuse(kind, "layer_types", layer_types,
                      "one of 'full_attention' / 'sliding_attention' per layer")
    sliding = tuple(i for i, t in enumerate(layer_types) if t == "sliding_attention")
    if not sliding or hf.get("sliding_window") is None:  # transformers: a "sliding" layer without a window is full
        return {}
    return {"window": hf["sliding_window"], "window_layers": None if len(sliding) == len(layer_types) else sliding}


def config_from_hf(hf: Mapping, *, ignore: Iterable[str] = ()) -> EncoderConfig | DecoderConfig:
    """attnkit config from a Hugging Face ``config.json`` (model_type bert, gpt2, llama, mistral, qwen2).

    Every key is classified: implemented, known not to change the numbers of the base model in
    evaluation (ids, dropout, initialisation, output switches), or refused. A value attnkit does not
    implement, or a key it does not know, raises :class:`UnsupportedConfigError` naming the key, its
    value and what is supported; ``ignore`` names unknown keys the caller vouches for. The model built
    from the result gives transformers' logits (fp32, 1e-4) or this function refuses.
    """
    if not isinstance(hf, Mapping):
        raise UnsupportedConfigError(f"a Hugging Face config must be a JSON object, got {type(hf).__name__}")
    kind = hf.get("model_type")
    if kind not in MODEL_TYPES:
        raise UnsupportedConfigError(f"model_type must be one of {MODEL_TYPES}, got {kind!r}")
    _check_keys(hf, kind, ignore)
    checked_values(hf, kind, _values(kind))
    try:
        return _config_from_hf(hf, kind)
    except KeyError as error:
        raise UnsupportedConfigError(f"{kind} config: required key {error.args[0]!r} is missing") from None
    except (TypeError, ValueError) as error:
        if isinstance(error, UnsupportedConfigError):
            raise
        raise UnsupportedConfigError(f"{kind} config: {error}") from None


def _values(kind: str) -> dict:
    """The kind of value each size key of a ``kind`` config.json takes (:mod:`.config_values`)."""
    if kind == "bert":
        return {**dict.fromkeys(("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                 "intermediate_size", "max_position_embeddings", "type_vocab_size"), SIZE),
                "layer_norm_eps": NON_NEGATIVE}
    if kind == "gpt2":
        return {**dict.fromkeys(("vocab_size", "n_embd", "n_layer", "n_head", "n_positions"), SIZE),
                "n_inner": nullable(SIZE), "layer_norm_epsilon": NON_NEGATIVE}
    return {**dict.fromkeys(("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                             "intermediate_size"), SIZE),
            **dict.fromkeys(("num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window"),
                            nullable(SIZE)),
            "max_window_layers": nullable(COUNT), "rms_norm_eps": NON_NEGATIVE, "rope_theta": POSITIVE}


def _config_from_hf(hf: Mapping, kind: str) -> EncoderConfig | DecoderConfig:
    if kind == "bert":
        _require(hf, kind, "position_embedding_type", "absolute", "'absolute'")
        _require(hf, kind, "is_decoder", False, "False (an encoder)")
        _require(hf, kind, "add_cross_attention", False, "False")
        return EncoderConfig(vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
                             num_heads=hf["num_attention_heads"], d_ff=hf["intermediate_size"],
                             max_len=hf["max_position_embeddings"], type_vocab_size=hf.get("type_vocab_size", 2),
                             norm_eps=hf.get("layer_norm_eps", 1e-12), dropout=0.0,
                             activation=_activation(hf, kind, "hidden_act", "gelu"))
    if kind == "gpt2":
        _require(hf, kind, "add_cross_attention", False, "False")
        return DecoderConfig(vocab_size=hf["vocab_size"], d_model=hf["n_embd"], num_layers=hf["n_layer"],
                             num_heads=hf["n_head"], d_ff=hf.get("n_inner") or 4 * hf["n_embd"],
                             max_len=hf["n_positions"], norm_eps=hf.get("layer_norm_epsilon", 1e-5),
                             activation=_activation(hf, kind, "activation_function", "gelu_new"),
                             scale_attention=bool(hf.get("scale_attn_weights", True)),
                             scale_by_layer=bool(hf.get("scale_attn_by_inverse_layer_idx", False)),
                             tie_embeddings=bool(hf.get("tie_word_embeddings", True)))
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    qkv_bias = True if kind == "qwen2" else bool(hf.get("attention_bias", False))
    return DecoderConfig(vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
                         num_heads=heads, num_kv_heads=hf.get("num_key_value_heads"), d_ff=hf["intermediate_size"],
                         max_len=hf.get("max_position_embeddings") or 4096, positional="rope", norm="rmsnorm",
                         norm_eps=hf.get("rms_norm_eps", 1e-6), mlp="swiglu", bias=False, qkv_bias=qkv_bias,
                         out_bias=kind != "qwen2" and bool(hf.get("attention_bias", False)),
                         mlp_bias=kind != "qwen2" and bool(hf.get("mlp_bias", False)),
                         activation=_activation(hf, kind, "hidden_act", "silu"),
                         attention_head_dim=None if head_dim * heads == hf["hidden_size"] else head_dim,
                         tie_embeddings=bool(hf.get("tie_word_embeddings", False)), **_rope(hf, kind),
                         **_windows(hf, kind))


# DeepSeek-V3 (and V3.2, with DeepSeek sparse attention): read into a DeepSeekConfig, every key classified.
_DEEPSEEK_IMPLEMENTED = frozenset({
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "q_lora_rank",
    "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "qk_head_dim", "head_dim", "intermediate_size",
    "moe_intermediate_size", "first_k_dense_replace", "n_routed_experts", "n_shared_experts", "num_experts_per_tok",
    "n_group", "topk_group", "routed_scaling_factor", "norm_topk_prob", "max_position_embeddings", "rope_parameters",
    "rope_scaling", "rope_theta", "rope_interleave", "rms_norm_eps", "attention_bias", "tie_word_embeddings",
    "hidden_act", "topk_method", "scoring_func", "moe_layer_freq", "mlp_bias", "index_topk", "index_n_heads",
    "index_head_dim", "layer_types", "mlp_layer_types",
})
_DEEPSEEK_HARMLESS = _HARMLESS_ANY | {
    "attention_dropout", "pretraining_tp", "num_nextn_predict_layers",  # the multi-token-prediction layers: not run
    "aux_loss_alpha", "seq_aux", "ep_size", "output_router_logits", "router_aux_loss_coef",  # training and sharding
}
_YARN_KEYS = {"rope_type", "type", "rope_theta", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
              "mscale", "mscale_all_dim"}


def deepseek_config_from_hf(hf: Mapping, *, ignore: Iterable[str] = ()):
    """A :class:`~attnkit.models.config.DeepSeekConfig` from a transformers DeepSeek-V3 or V3.2 ``config.json``:
    every key implemented, harmless in evaluation, or refused by name (:class:`UnsupportedConfigError`)."""
    from .config import DeepSeekConfig

    kind = hf.get("model_type") if isinstance(hf, Mapping) else None
    if kind not in ("deepseek_v3", "deepseek_v32"):
        raise UnsupportedConfigError(f"model_type must be 'deepseek_v3' or 'deepseek_v32', got {kind!r} (DeepSeek-V2's "
                                     "softmax router is not implemented natively; the transformers bridge runs it)")
    unknown = sorted(key for key in set(hf) - _DEEPSEEK_IMPLEMENTED - _DEEPSEEK_HARMLESS - set(ignore)
                     if not means_none(key, hf[key]))
    if unknown:
        raise UnsupportedConfigError(f"{kind} config: unknown keys {unknown}; attnkit implements "
                                     f"{sorted(_DEEPSEEK_IMPLEMENTED)} and ignores only keys known not to change the numbers")
    for key, expected in (("topk_method", "noaux_tc"), ("scoring_func", "sigmoid"), ("hidden_act", "silu"),
                          ("moe_layer_freq", 1), ("mlp_bias", False)):
        _require(hf, kind, key, expected, repr(expected))
    for key in ("n_group", "topk_group"):
        value = hf.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise _refuse(kind, key, value, "an int >= 1 (transformers' router picks topk_group of n_group expert groups; "
                          "0 groups leaves it no expert to choose from)")
    if (hf.get("topk_group") or 1) > (hf.get("n_group") or 1):
        raise _refuse(kind, "topk_group", hf["topk_group"], f"at most n_group ({hf.get('n_group') or 1})")
    for key in ("head_dim", "qk_head_dim"):  # transformers computes both; a config that says otherwise does not run there
        derived = {"head_dim": hf.get("qk_rope_head_dim"), "qk_head_dim":
                   (hf.get("qk_nope_head_dim") or 0) + (hf.get("qk_rope_head_dim") or 0)}[key]
        if hf.get(key) is not None and hf[key] != derived:
            raise _refuse(kind, key, hf[key], f"{derived} ({'qk_rope_head_dim' if key == 'head_dim' else 'qk_nope_head_dim + qk_rope_head_dim'}: "
                          "transformers' rotary embedding and attention take their sizes from it, and another value "
                          "does not run there)")
    heads = hf["num_attention_heads"]
    if hf.get("num_key_value_heads", heads) != heads:
        raise _refuse(kind, "num_key_value_heads", hf["num_key_value_heads"], f"num_attention_heads ({heads}): every head "
                      "reads the latent")
    for key in ("layer_types", "mlp_layer_types"):  # V3.2 names what its other keys already say
        values = set(hf.get(key) or [])
        allowed = {"layer_types": {"full_attention", "indexed_attention"}, "mlp_layer_types": {"dense", "sparse"}}[key]
        if values - allowed:
            raise _refuse(kind, key, sorted(values), f"entries in {sorted(allowed)}")
    params = {**(hf.get("rope_scaling") or {}), **(hf.get("rope_parameters") or {})}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "yarn"):
        raise _refuse(kind, "rope_parameters['rope_type']", rope_type, "'default' or 'yarn'")
    extra = sorted(set(params) - (_YARN_KEYS if rope_type == "yarn" else {"rope_type", "type", "rope_theta"}))
    if extra:
        raise _refuse(kind, f"rope_parameters[{extra[0]!r}]", params[extra[0]], f"for rope_type {rope_type!r}")
    yarn: dict[str, Any] = {} if rope_type == "default" else dict(
        rope_scaling="yarn", rope_factor=float(params["factor"]),
        rope_original_max_len=int(params["original_max_position_embeddings"]),
        rope_beta_fast=float(params.get("beta_fast") or 32), rope_beta_slow=float(params.get("beta_slow") or 1),
        rope_mscale=params.get("mscale"), rope_mscale_all_dim=params.get("mscale_all_dim"))
    sparse = kind == "deepseek_v32"
    try:
        return DeepSeekConfig(
            vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], num_layers=hf["num_hidden_layers"], num_heads=heads,
            q_lora_rank=hf.get("q_lora_rank"), kv_lora_rank=hf["kv_lora_rank"], qk_nope_head_dim=hf["qk_nope_head_dim"],
            qk_rope_head_dim=hf["qk_rope_head_dim"], v_head_dim=hf["v_head_dim"], d_ff=hf["intermediate_size"],
            moe_d_ff=hf["moe_intermediate_size"], first_dense_layers=hf.get("first_k_dense_replace", 0),
            num_experts=hf["n_routed_experts"], num_shared_experts=hf.get("n_shared_experts") or 0,
            experts_per_token=hf["num_experts_per_tok"], expert_groups=hf.get("n_group") or 1,
            groups_per_token=hf.get("topk_group") or 1, routed_scaling=float(hf.get("routed_scaling_factor", 1.0)),
            norm_topk_prob=bool(hf.get("norm_topk_prob", True)), max_len=hf.get("max_position_embeddings") or 4096,
            rope_base=float(params.get("rope_theta", hf.get("rope_theta", 10000.0))),
            rope_interleave=bool(hf.get("rope_interleave", True)), **({"rope_scaling": None} | yarn),
            norm_eps=hf.get("rms_norm_eps", 1e-6), attention_bias=bool(hf.get("attention_bias", False)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            index_topk=hf.get("index_topk", 2048) if sparse else None, index_heads=hf.get("index_n_heads", 64),
            index_head_dim=hf.get("index_head_dim", 128))
    except KeyError as error:
        raise UnsupportedConfigError(f"{kind} config: required key {error.args[0]!r} is missing") from None
    except (TypeError, ValueError) as error:
        raise UnsupportedConfigError(f"{kind} config: {error}") from None
