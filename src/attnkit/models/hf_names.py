"""Hugging Face tensor names <-> attnkit's, for the naming families BERT, GPT-2 (Conv1D layouts)
and Llama (Mistral and Qwen2 use Llama's names), checked against the model's own ``state_dict()``
both ways: a tensor that is missing, unexpected or mis-shaped is named with both shapes, and a model
tensor the Hugging Face layout has no name for is refused, never dropped. Loading never executes
code (safetensors only).

    model = DecoderLM(config_from_hf(json.load(open("config.json"))))
    load_hf_safetensors(model, "model.safetensors", family="llama")
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .._files import atomic_path
from .config import DecoderConfig, EncoderConfig
from .decoder import DecoderLM
from .encoder import EncoderModel
from .hf_config import UnsupportedConfigError, config_from_hf
from .weights import check_tensors, config_from_folder, read_checkpoint_folder, read_safetensors, untied_by_checkpoint

__all__ = ["NAME_FAMILIES", "to_hf", "from_hf", "load_hf_state_dict", "load_hf_safetensors", "save_hf_safetensors",
           "load_named_folder"]

NAME_FAMILIES = ("bert", "gpt2", "llama")
"""Tensor naming families. Mistral and Qwen2 checkpoints use Llama's names."""
# Prefixes Hugging Face adds in task models (BertForX, GPT2LMHeadModel, LlamaForCausalLM).
_PREFIXES = {"bert": "bert.", "gpt2": "transformer.", "llama": "model."}
# Buffers some checkpoints carry that are not weights.
_IGNORED_SUFFIXES = ("embeddings.position_ids", ".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")
# Task heads of BERT checkpoints (BertForMaskedLM, BertForPreTraining, ...): not part of the encoder.
_HEAD_PREFIXES = {"bert": ("cls.", "classifier.", "qa_outputs."), "gpt2": (), "llama": ()}


def _check_family(family: str) -> None:
    if family not in NAME_FAMILIES:
        raise ValueError(f"family must be one of {NAME_FAMILIES} (mistral and qwen2 use 'llama'), got {family!r}")

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
    if isinstance(config, DecoderConfig) and family == "gpt2" and (config.positional != "learned" or config.mlp != "gelu" or not all(
            config.has_bias(part) for part in ("qkv", "out", "mlp"))):
        raise UnsupportedConfigError("family 'gpt2' needs learned positions, a plain (non-gated) MLP and biases "
                                     "everywhere; save this model under family 'llama' or change the config")
    if isinstance(config, DecoderConfig) and family == "llama" and (config.positional != "rope" or config.mlp != "swiglu"):
        raise UnsupportedConfigError("family 'llama' needs positional='rope' and mlp='swiglu'")
    builders: dict[str, Callable[[Any], list[tuple[str, str]]]] = {
        "bert": _bert_pairs, "gpt2": _gpt2_pairs, "llama": _llama_pairs}
    return builders[family](config)


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


def load_named_folder(folder: str | os.PathLike, *, ignore: Iterable[str] = ()) -> EncoderModel | DecoderLM:
    """A BERT, GPT-2, Llama, Mistral or Qwen2 model from a Hugging Face folder (``config.json`` +
    ``model.safetensors`` or its shards, :func:`~attnkit.models.weights.read_checkpoint_folder`), in eval mode: the named families' part of
    :func:`attnkit.models.pretrained.load_hf_folder`, the one loader.

    A BERT checkpoint without pooler tensors (``BertForMaskedLM``, ``add_pooling_layer=False``)
    gives an encoder without a pooler; ``ignore`` is passed to :func:`config_from_hf`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"Hugging Face folder not found: {folder}")
    config = config_from_folder(folder, config_from_hf, ignore=ignore)
    tensors = read_checkpoint_folder(folder)
    if isinstance(config, EncoderConfig) and not any(n.endswith("pooler.dense.weight") for n in tensors):
        config = dataclasses.replace(config, pooler=False)
    if isinstance(config, DecoderConfig):
        embedding = next((name for name in _EMBEDDINGS if name in tensors), _EMBEDDINGS[0])
        config = untied_by_checkpoint(config, tensors, embedding)
    model = EncoderModel(config) if isinstance(config, EncoderConfig) else DecoderLM(config)
    load_hf_state_dict(model, tensors, _family_of(config), source=str(folder))
    return model.eval()


_EMBEDDINGS = ("model.embed_tokens.weight", "transformer.wte.weight", "wte.weight")
"""The token embedding's name in the named families' checkpoints (Llama, Mistral and Qwen2; GPT-2's two forms)."""
