"""Which transformers families may run attnkit's attention, and the guard on every route there.

A family is verified when tests/external/hf_families.py's walk found its tiny random model equal to
``attn_implementation="eager"`` (logits, every attention weight, every gradient with left padding
and unmasked first labels, greedy ids with the dynamic and the static cache) with attnkit's attention
called in every compared forward. Any other ``model_type`` is refused by name on every route that
sets an attention implementation: construction and ``from_pretrained`` (each sub-model checks its own
config), ``set_attn_implementation`` with a string or a dict (every sub-model and sub-config it
reaches, rolled back on refusal), and at the call itself (an attention module whose config names an
unverified family). A model that would stay on another implementation although attnkit was asked for
(its attention does not go through transformers' ``AttentionInterface``) is refused too.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch

from ..errors import InputError

__all__ = ["IMPLEMENTATION", "VERIFIED_FAMILIES", "REFUSED_REASONS", "UnsupportedFeature", "UnverifiedFamily", "UnverifiedFamilyWarning",
           "check_family", "allow", "model_type", "permitted", "install_guard", "is_registered"]

IMPLEMENTATION = "attnkit"
"""The name to pass as ``attn_implementation``."""

VERIFIED_FAMILIES: dict[str, str] = {
    # model_type: the model kind the walk ran (decoder: causal LM; encoder: masked LM; seq2seq), each
    # equal to attn_implementation="eager" in tests/external/test_hf_families.py with attnkit's attention
    # called in every compared forward; whisper ("speech") in tests/external/test_hf_bridge.py.
    "afmoe": "decoder", "albert": "encoder", "apertus": "decoder", "arcee": "decoder", "aria_text": "decoder",
    "bart": "seq2seq", "beam": "decoder", "bert": "encoder", "bert-generation": "decoder", "biogpt": "decoder",
    "bitnet": "decoder", "blenderbot": "seq2seq", "blenderbot-small": "seq2seq", "camembert": "encoder",
    "cohere": "decoder", "cohere2": "decoder", "cohere2_moe": "decoder", "ctrl": "decoder", "cwm": "decoder",
    "data2vec-text": "encoder", "deepseek_v2": "decoder", "deepseek_v3": "decoder", "deepseek_v32": "decoder",
    "deepseek_v4": "decoder", "diffllama": "decoder", "distilbert": "encoder", "doge": "decoder", "dots1": "decoder",
    "electra": "encoder", "ernie": "encoder", "ernie4_5": "decoder", "ernie4_5_moe": "decoder", "eurobert": "encoder",
    "exaone4": "decoder", "exaone_moe": "decoder", "falcon_h1": "decoder", "flex_olmo": "decoder", "flint": "decoder",
    "gemma": "decoder", "gemma2": "decoder", "gemma3_text": "decoder", "glm": "decoder", "glm4": "decoder",
    "glm4_moe": "decoder", "glm4_moe_lite": "decoder", "glm_moe_dsa": "decoder", "gpt-sw3": "decoder", "gpt2": "decoder", "gpt_bigcode": "decoder", "gpt_neox": "decoder",
    "gpt_oss": "decoder", "granite": "decoder", "granitemoe": "decoder", "granitemoeshared": "decoder",
    "gte": "encoder", "helium": "decoder", "hrm_text": "decoder", "hunyuan_v1_dense": "decoder",
    "hunyuan_v1_moe": "decoder", "hy_v3": "decoder", "hy_v4": "decoder", "hyperclovax": "decoder",
    "inkling_text": "decoder", "internlm3": "decoder", "iquestcoder": "decoder", "jais2": "decoder",
    "jetmoe": "decoder", "jina_embeddings_v3": "encoder", "kolibri1": "decoder", "laguna": "decoder",
    "layoutlm": "encoder", "lfm2": "decoder", "llama": "decoder", "llama4_text": "decoder", "longcat_flash": "decoder",
    "m2m_100": "seq2seq",
    "marian": "seq2seq", "mbart": "seq2seq", "mellum": "decoder", "mimo_v2_flash": "decoder", "minimax_m2": "decoder",
    "minimax_m3_vl_text": "decoder", "ministral": "decoder", "ministral3": "decoder", "mistral": "decoder",
    "mixtral": "decoder", "modernbert": "encoder", "modernbert-decoder": "decoder", "moshi": "decoder",
    "mt5": "seq2seq", "nanochat": "decoder", "nemotron": "decoder", "nemotron_h": "decoder", "nllb-moe": "seq2seq",
    "nomic_bert": "encoder", "olmo": "decoder", "olmo2": "decoder", "olmo3": "decoder", "olmo_hybrid": "decoder",
    "olmoe": "decoder", "opt": "decoder", "pegasus": "seq2seq", "persimmon": "decoder", "phi": "decoder",
    "phi3": "decoder", "phimoe": "decoder", "plbart": "seq2seq", "qwen2": "decoder", "qwen2_moe": "decoder", "qwen2_vl_text": "text tower",
    "qwen3": "decoder", "qwen3_moe": "decoder", "roberta": "encoder", "roberta-prelayernorm": "encoder",
    "sarvam_mla": "decoder", "seamless_m4t": "seq2seq", "seamless_m4t_v2": "seq2seq", "seed_oss": "decoder",
    "smollm3": "decoder",
    "solar_open": "decoder", "stablelm": "decoder", "starcoder2": "decoder", "switch_transformers": "seq2seq",
    "t5": "seq2seq", "ultrabert": "encoder", "umt5": "seq2seq", "vaultgemma": "decoder", "whisper": "speech",
    "xlm-roberta": "encoder", "xlm-roberta-xl": "encoder",
    # hybrids of linear and softmax attention (2026-11-26): the softmax layers through attnkit, the linear ones
    # (Gated DeltaNet, Kimi Delta Attention, lightning attention, Mamba) transformers' own; the walk builds both
    "qwen3_next": "decoder", "qwen3_5_text": "decoder", "qwen3_5_moe_text": "decoder", "kimi_linear": "decoder",
    "minimax": "decoder", "lara_mini": "decoder", "bailing_hybrid": "decoder", "jamba": "decoder", "bamba": "decoder",
    "granitemoehybrid": "decoder",
}
"""The families whose attention runs through attnkit, tested family by family (docs/hf.md lists them)."""

REFUSED_REASONS: dict[str, str] = {
    "zamba2": "the walk cannot build its tiny model (its hybrid_layer_ids and shared blocks keep their full sizes)",
    "glm5_next": "transformers exports no causal-LM class for it to walk",
    "qwen4_exp": "a composite config with no text model of its own to walk",
}
"""Hybrid families the walk could not verify, each with why (named in the refusal)."""


class UnsupportedFeature(InputError):
    """A model asks its attention for something attnkit does not implement."""


class UnverifiedFamily(UnsupportedFeature):
    """A model family whose attention attnkit has not verified against transformers' eager one."""


class UnverifiedFamilyWarning(UserWarning):
    """Loading an unverified family with an explicit opt-in (``register(allow_unverified=[...])``)."""


_ALLOWED_UNVERIFIED: set[str] = set()


def allow(names) -> None:
    """Let these ``model_type`` names load (with a warning) although unverified."""
    if isinstance(names, str) or not all(isinstance(name, str) for name in names):
        raise TypeError(f"allow_unverified must be a list of model_type names, got {names!r}")
    _ALLOWED_UNVERIFIED.update(names)


def model_type(config) -> Any:
    """``config.model_type`` (None where there is none), read past transformers' ``PreTrainedConfig.__getattribute__``
    (its attribute aliases: 1.2 us a read, and the bridge reads it on every layer call); under torch.compile the
    ordinary way, since dynamo breaks its graph on ``object.__getattribute__``. A config answering through
    ``__getattr__`` is asked the ordinary way too."""
    if not torch.compiler.is_compiling():
        try:
            return object.__getattribute__(config, "model_type")
        except AttributeError:
            pass
    return getattr(config, "model_type", None)


def permitted(family) -> bool:
    """Whether attnkit may run in a module of this ``model_type`` (verified, or allowed by name)."""
    return family in VERIFIED_FAMILIES or family in _ALLOWED_UNVERIFIED


def check_family(config, owner: str = "this model") -> None:
    """Raise :class:`UnverifiedFamily` unless ``config.model_type`` is one attnkit verified (or
    warn if the caller allowed it unverified)."""
    family = getattr(config, "model_type", None)
    if family in VERIFIED_FAMILIES:
        return
    reason = f" ({REFUSED_REASONS[family]})" if family in REFUSED_REASONS else ""
    message = (f"{owner}: model_type {family!r} is not a family attnkit has verified against eager attention{reason} "
               f"(attnkit.hf.VERIFIED_FAMILIES: {len(VERIFIED_FAMILIES)} families); load it with attn_implementation='eager' or "
               f"'sdpa', or opt in with attnkit.hf.register(allow_unverified=[{family!r}])")
    if family in _ALLOWED_UNVERIFIED:
        warnings.warn(message.replace("load it with", "loaded anyway (allowed); numbers unverified, else load it with"),
                      UnverifiedFamilyWarning, stacklevel=3)
        return
    raise UnverifiedFamily(message)


def is_registered() -> bool:
    """Whether ``"attnkit"`` is in transformers' attention interface (``attnkit.hf.register()``)."""
    from transformers import AttentionInterface

    return IMPLEMENTATION in AttentionInterface._global_mapping


def _require_registered(request) -> None:
    if _mentions(request) and not is_registered():
        raise UnsupportedFeature(
            f"attn_implementation={request!r} names attnkit, which is not registered with transformers yet: "
            "call attnkit.hf.register() first")


def _mentions(request) -> bool:
    """Whether an ``attn_implementation`` request (a string or a nested dict) asks for attnkit."""
    if isinstance(request, dict):
        return any(_mentions(value) for value in request.values())
    return request == IMPLEMENTATION


def _configs(model) -> Iterator[tuple[str, Any]]:
    """(owner, config) for the model's config, its sub-configs at any depth and every sub-model's
    config, each once."""
    from transformers import PreTrainedModel

    seen: set[int] = set()
    queue = deque([(type(model).__name__, model.config)])
    queue.extend((f"{type(m).__name__} ({name})", m.config) for name, m in model.named_modules()
                 if isinstance(m, PreTrainedModel) and m is not model)
    while queue:
        owner, config = queue.popleft()
        if id(config) in seen:
            continue
        seen.add(id(config))
        yield owner, config
        for key in getattr(config, "sub_configs", {}) or {}:
            sub = getattr(config, key, None)
            if sub is not None:
                queue.append((f"{owner}.{key}", sub))


def _requested(model, request) -> dict[int, str]:
    """id(config) -> the implementation ``set_attn_implementation(request)`` asks of it, following
    transformers' rules: a string reaches every sub-config; a dict names sub-configs by key (nested
    dicts their own), "" the config itself, and leaves the others as they are."""
    top = request.get("", model.config._attn_implementation) if isinstance(request, dict) else request
    asked = {id(model.config): top}
    queue = deque([(model.config, request if isinstance(request, dict) else top)])
    while queue:
        config, implementation = queue.popleft()
        for key in getattr(config, "sub_configs", {}) or {}:
            sub = getattr(config, key, None)
            if sub is None:
                continue
            value = implementation.get(key, sub._attn_implementation) if isinstance(implementation, dict) else implementation
            asked[id(sub)] = value.get("", sub._attn_implementation) if isinstance(value, dict) else value
            queue.append((sub, value))
    return asked


def _check_model(model, request) -> None:
    """After ``set_attn_implementation(request)``: every config now on attnkit is a permitted family,
    and every sub-model asked for attnkit is on it."""
    from transformers import PreTrainedModel

    for owner, config in _configs(model):
        if config._attn_implementation == IMPLEMENTATION:
            check_family(config, owner)
    asked = _requested(model, request)
    top = asked[id(model.config)]
    for name, module in [("", model), *model.named_modules()]:
        if not isinstance(module, PreTrainedModel) or (name and module is model):
            continue
        wanted = asked.get(id(module.config), top)
        if wanted == IMPLEMENTATION and module.config._attn_implementation != IMPLEMENTATION:
            raise UnsupportedFeature(
                f"{type(module).__name__} (model_type {getattr(module.config, 'model_type', None)!r}) does not route its "
                "attention through transformers' AttentionInterface, so attnkit cannot run in it: transformers left it "
                f"on {module.config._attn_implementation!r}")


def install_guard() -> None:
    """Wrap the two transformers methods that set an attention implementation (idempotent):
    ``_check_and_adjust_attn_implementation`` (construction, ``from_pretrained``) and
    ``set_attn_implementation``. They change nothing for any other implementation."""
    from transformers import PreTrainedModel

    check = PreTrainedModel._check_and_adjust_attn_implementation
    if not getattr(check, "_attnkit_guard", False):
        def guarded_check(self, attn_implementation, *args, **kwargs):
            _require_registered(attn_implementation)
            chosen = check(self, attn_implementation, *args, **kwargs)
            if chosen == IMPLEMENTATION:
                check_family(getattr(self, "config", None), type(self).__name__)
                if not type(self)._can_set_attn_implementation():
                    raise UnsupportedFeature(
                        f"{type(self).__name__} does not route its attention through transformers' AttentionInterface, "
                        "so attnkit would never run in it; load it with attn_implementation='eager' or 'sdpa'")
            return chosen

        guarded_check._attnkit_guard = True  # type: ignore[attr-defined]
        PreTrainedModel._check_and_adjust_attn_implementation = guarded_check  # type: ignore[method-assign]
    setter = PreTrainedModel.set_attn_implementation
    if not getattr(setter, "_attnkit_guard", False):
        def guarded_set(self, attn_implementation, *args, **kwargs):
            if not _mentions(attn_implementation):
                return setter(self, attn_implementation, *args, **kwargs)
            _require_registered(attn_implementation)
            before = [(config, config._attn_implementation_internal) for _, config in _configs(self)]
            try:
                setter(self, attn_implementation, *args, **kwargs)
                _check_model(self, attn_implementation)
            except BaseException:
                for config, value in before:  # all or nothing: the model stays as it was
                    config._attn_implementation_internal = value
                raise

        guarded_set._attnkit_guard = True  # type: ignore[attr-defined]
        PreTrainedModel.set_attn_implementation = guarded_set  # type: ignore[method-assign]
