"""attnkit inside Hugging Face transformers: ``"attnkit"`` as an attention implementation.

    import attnkit.hf
    attnkit.hf.register()
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="attnkit")

Every attention call of a model whose family routes attention through transformers'
``AttentionInterface`` then runs :func:`attnkit.attention` (``backend="auto"``): grouped-query heads
without repeating K/V, T5's ``position_bias`` as an additive bias, Gemma 2's softcapping as a
``score_mod``, gpt-oss's learned sinks as ``sinks``. With ``output_attentions=True`` the exact
weights come back while the output stays on the fast backend (attnkit's weights on demand).

The promise is transformers' eager numbers or a clear refusal, never a third outcome:

- masks: where attnkit's mask function has *proved* a mask is plain structure (transformers'
  causal, causal sliding-window or bidirectional mask function, top-left or bottom-right offsets)
  plus padding, it travels as the padding alone with the structure attached
  (:class:`StructuredMask`); anything else (packed sequences, static caches on an accelerator,
  overlays, a user's own 4D mask of any shape) is transformers' mask, applied unchanged;
- families: only those in :data:`VERIFIED_FAMILIES` load with ``attn_implementation="attnkit"``;
  the list is what tests/external/hf_families.py's walk over transformers' registry found equal
  to eager (logits, weights, gradients, greedy ids with the dynamic and the static cache, left
  padding). Any other family raises :class:`UnverifiedFamily` at load (or warns, by opt-in).

Requires the ``hf`` extra (transformers).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import importlib
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .errors import InputError
from .functional.attention import attention
from .functional.block_mask import ScoreMod

__all__ = ["IMPLEMENTATION", "VERIFIED_FAMILIES", "register", "check_family", "UnverifiedFamily",
           "UnverifiedFamilyWarning", "StructuredMask", "attnkit_attention_forward", "attnkit_mask", "record",
           "Recording", "attention_modules", "UnsupportedFeature"]

IMPLEMENTATION = "attnkit"
"""The name to pass as ``attn_implementation``."""

VERIFIED_FAMILIES: dict[str, str] = {
    # model_type: the model kind the walk ran (decoder: causal LM; encoder: masked LM; seq2seq), each
    # equal to attn_implementation="eager" in tests/external/test_hf_families.py; whisper ("speech")
    # in tests/external/test_hf_bridge.py.
    "afmoe": "decoder", "albert": "encoder", "apertus": "decoder", "arcee": "decoder", "aria_text": "decoder",
    "bart": "seq2seq", "beam": "decoder", "bert": "encoder", "bert-generation": "decoder", "biogpt": "decoder",
    "bitnet": "decoder", "blenderbot": "seq2seq", "blenderbot-small": "seq2seq", "camembert": "encoder",
    "cohere": "decoder", "cohere2": "decoder", "cohere2_moe": "decoder", "ctrl": "decoder", "cwm": "decoder",
    "data2vec-text": "encoder", "deberta": "encoder", "deberta-v2": "encoder", "diffllama": "decoder",
    "distilbert": "encoder", "doge": "decoder", "dots1": "decoder", "electra": "encoder", "ernie": "encoder",
    "ernie4_5": "decoder", "ernie4_5_moe": "decoder", "eurobert": "encoder", "exaone4": "decoder",
    "exaone_moe": "decoder", "falcon_h1": "decoder", "falcon_mamba": "decoder", "flaubert": "encoder",
    "flex_olmo": "decoder", "flint": "decoder", "fnet": "encoder", "fsmt": "seq2seq", "gemma": "decoder",
    "gemma2": "decoder", "gemma3_text": "decoder", "glm": "decoder", "glm4": "decoder", "glm4_moe": "decoder",
    "gpt-sw3": "decoder", "gpt2": "decoder", "gpt_bigcode": "decoder", "gpt_neox": "decoder", "gpt_oss": "decoder",
    "granite": "decoder", "granitemoe": "decoder", "granitemoeshared": "decoder", "gte": "encoder",
    "helium": "decoder", "hrm_text": "decoder", "hunyuan_v1_dense": "decoder", "hunyuan_v1_moe": "decoder",
    "hy_v3": "decoder", "hy_v4": "decoder", "hyperclovax": "decoder", "inkling_text": "decoder",
    "internlm3": "decoder", "iquestcoder": "decoder", "jais2": "decoder", "jetmoe": "decoder",
    "jina_embeddings_v3": "encoder", "kolibri1": "decoder", "laguna": "decoder", "layoutlm": "encoder",
    "lfm2": "decoder", "llama": "decoder", "llama4_text": "decoder", "m2m_100": "seq2seq", "mamba": "decoder",
    "marian": "seq2seq", "mbart": "seq2seq", "mellum": "decoder", "mimo_v2_flash": "decoder",
    "minimax_m2": "decoder", "minimax_m3_vl_text": "decoder", "ministral": "decoder", "ministral3": "decoder",
    "mistral": "decoder", "mixtral": "decoder", "modernbert": "encoder", "modernbert-decoder": "decoder",
    "moshi": "decoder", "mra": "encoder", "mt5": "seq2seq", "nanochat": "decoder", "nemotron": "decoder",
    "nemotron_h": "decoder", "nllb-moe": "seq2seq", "nomic_bert": "encoder", "olmo": "decoder", "olmo2": "decoder",
    "olmo3": "decoder", "olmo_hybrid": "decoder", "olmoe": "decoder", "openai-gpt": "decoder", "opt": "decoder",
    "pegasus": "seq2seq", "persimmon": "decoder", "phi": "decoder", "phi3": "decoder", "phimoe": "decoder",
    "plbart": "seq2seq", "qwen2": "decoder", "qwen2_moe": "decoder", "qwen3": "decoder", "qwen3_moe": "decoder",
    "roberta": "encoder", "roberta-prelayernorm": "encoder", "seamless_m4t": "seq2seq", "seamless_m4t_v2": "seq2seq",
    "seed_oss": "decoder", "smollm3": "decoder", "solar_open": "decoder", "stablelm": "decoder",
    "starcoder2": "decoder", "switch_transformers": "seq2seq", "t5": "seq2seq", "ultrabert": "encoder",
    "umt5": "seq2seq", "vaultgemma": "decoder", "whisper": "speech", "xlm": "encoder", "xlm-roberta": "encoder",
    "xlm-roberta-xl": "encoder", "yoso": "encoder",
}
"""The families whose attention runs through attnkit, tested family by family (README lists them)."""

class UnsupportedFeature(InputError):
    """A model asks its attention for something attnkit does not implement."""


class UnverifiedFamily(UnsupportedFeature):
    """A model family whose attention attnkit has not verified against transformers' eager one."""


class UnverifiedFamilyWarning(UserWarning):
    """Loading an unverified family with an explicit opt-in (``register(allow_unverified=[...])``)."""


_ALLOWED_UNVERIFIED: set[str] = set()


def register(*, allow_unverified: Sequence[str] = ()) -> None:
    """Register ``"attnkit"`` with transformers' attention and mask interfaces (idempotent), and
    guard loading: a model whose ``model_type`` is not in :data:`VERIFIED_FAMILIES` raises
    :class:`UnverifiedFamily` when it is built with ``attn_implementation="attnkit"``
    (``from_pretrained``, ``from_config``, ``set_attn_implementation``). Families named in
    ``allow_unverified`` load with an :class:`UnverifiedFamilyWarning` instead: their numbers are
    nobody's promise."""
    from transformers import AttentionInterface, PreTrainedModel
    from transformers.masking_utils import AttentionMaskInterface

    if isinstance(allow_unverified, str) or not all(isinstance(name, str) for name in allow_unverified):
        raise TypeError(f"allow_unverified must be a list of model_type names, got {allow_unverified!r}")
    AttentionInterface.register(IMPLEMENTATION, attnkit_attention_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, attnkit_mask)
    _ALLOWED_UNVERIFIED.update(str(name) for name in allow_unverified)
    check = getattr(PreTrainedModel, "_check_and_adjust_attn_implementation", None)
    if check is None:
        raise RuntimeError("this transformers has no PreTrainedModel._check_and_adjust_attn_implementation, where "
                           "attnkit refuses unverified families at load time; use a transformers attnkit supports")
    if not getattr(check, "_attnkit_guard", False):
        def guarded(self, attn_implementation, *args, **kwargs):
            chosen = check(self, attn_implementation, *args, **kwargs)
            if chosen == IMPLEMENTATION:
                check_family(getattr(self, "config", None), type(self).__name__)
            return chosen

        guarded._attnkit_guard = True  # type: ignore[attr-defined]
        PreTrainedModel._check_and_adjust_attn_implementation = guarded  # type: ignore[method-assign]  # the guard


def check_family(config, owner: str = "this model") -> None:
    """Raise :class:`UnverifiedFamily` unless ``config.model_type`` is one attnkit verified (or
    warn if the caller allowed it unverified)."""
    family = getattr(config, "model_type", None)
    if family in VERIFIED_FAMILIES:
        return
    message = (f"{owner}: model_type {family!r} is not a family attnkit has verified against eager attention "
               f"(attnkit.hf.VERIFIED_FAMILIES: {len(VERIFIED_FAMILIES)} families); load it with attn_implementation='eager' or "
               f"'sdpa', or opt in with attnkit.hf.register(allow_unverified=[{family!r}])")
    if family in _ALLOWED_UNVERIFIED:
        warnings.warn(message.replace("load it with", "loaded anyway (allowed); numbers unverified, else load it with"),
                      UnverifiedFamilyWarning, stacklevel=3)
        return
    raise UnverifiedFamily(message)


@dataclass(frozen=True)
class _Structure:
    """What :func:`attnkit_mask` proved a mask to be: causal or not, a causal window, the causal
    alignment, and whether the tensor's values are a padding mask (else all True, ignored)."""

    is_causal: bool
    window: int | None
    causal_align: str
    padded: bool


class StructuredMask(Tensor):
    """The (B|1, 1, 1, S) boolean padding mask attnkit's mask function returns where it has proved
    the whole mask is structure (causal, a causal window, or bidirectional) plus padding; the
    structure rides along as ``structure``. Any operation on it yields a StructuredMask without a
    structure, which the attention function refuses instead of guessing."""

    structure: _Structure | None = None


def _structured(padding: Tensor, structure: _Structure) -> Tensor:
    mask = padding.as_subclass(StructuredMask)
    mask.structure = structure
    return mask


def _int_offset(value) -> int | None:
    if isinstance(value, Tensor):  # a static cache's offset: read it only where that costs no sync
        return int(value) if value.device.type == "cpu" and value.numel() == 1 else None
    return int(value)


def _sliding_window_of(mask_function) -> int | None:
    """w if ``mask_function`` is transformers' ``sliding_window_causal_mask_function(w)`` (an
    ``and_masks`` of the window overlay and the causal function), else None."""
    from transformers import masking_utils as mu

    if getattr(mask_function, "__qualname__", "") != "and_masks.<locals>.and_mask" or not mask_function.__closure__:
        return None
    parts = mask_function.__closure__[0].cell_contents
    if not isinstance(parts, tuple) or len(parts) != 2 or parts[1] is not mu.causal_mask_function:
        return None
    overlay = parts[0]
    if getattr(overlay, "__qualname__", "") != "sliding_window_overlay.<locals>.inner_mask" or not overlay.__closure__:
        return None
    window = overlay.__closure__[0].cell_contents
    return window if isinstance(window, int) and not isinstance(window, bool) and window >= 1 else None


def _recognise(mask_function, local_size, allow_causal: bool, allow_bidirectional: bool, q_length: int,
               kv_length: int, q_offset, kv_offset) -> _Structure | None:
    """The structure of the mask transformers asks for, where it is provably one attnkit applies
    itself; None where it must be built (packed sequences, or/and overlays, chunks, odd offsets)."""
    from transformers import masking_utils as mu

    q0, k0 = _int_offset(q_offset), _int_offset(kv_offset)
    if q0 is None or k0 is None:
        return None
    if mask_function is mu.bidirectional_mask_function and local_size is None and allow_bidirectional:
        return _Structure(is_causal=False, window=None, causal_align="top-left", padded=False)
    if not allow_causal:
        return None
    if mask_function is mu.causal_mask_function and local_size is None:
        window = None
    else:
        window = _sliding_window_of(mask_function)
        if window is None or window != local_size:
            return None
    offset = q0 - k0  # key j is allowed for query i iff j <= i + offset (and > i + offset - window)
    if offset == 0:
        align = "top-left"
    elif offset == kv_length - q_length:
        align = "bottom-right"
    else:
        return None
    return _Structure(is_causal=True, window=window, causal_align=align, padded=False)


def attnkit_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                 mask_function=None, attention_mask: Tensor | None = None, local_size: int | None = None,
                 allow_is_causal_skip: bool = True, allow_is_bidirectional_skip: bool = False, **kwargs) -> Tensor | None:
    """The mask transformers asks for (its mask interface's signature).

    Where the whole mask is provably structure plus padding (transformers' plain causal, causal
    sliding-window or bidirectional mask function, offsets that are top-left or bottom-right, the
    caller allowing a skipped mask), a :class:`StructuredMask` of the padding alone, (B, 1, 1, S),
    carries that structure to :func:`attnkit_attention_forward`: no (L, S) tensor is built.
    Anything else gets transformers' own SDPA mask, fully built, and is used unchanged."""
    from transformers import masking_utils as mu

    mask_function = mu.causal_mask_function if mask_function is None else mask_function
    structure = _recognise(mask_function, local_size, allow_is_causal_skip, allow_is_bidirectional_skip, q_length,
                           kv_length, q_offset, kv_offset)
    padding = None
    if structure is not None and attention_mask is not None:
        if attention_mask.dim() == 2:
            start = _int_offset(kv_offset)  # an int: _recognise has read it
            prepared = mu.prepare_padding_mask(attention_mask, kv_length, kv_offset)
            if start is not None and prepared is not None:
                padding = prepared[:, start:start + kv_length]
        if padding is None or tuple(padding.shape) != (batch_size, kv_length):
            structure = None  # not a plain (B, S) padding mask: transformers builds the whole mask
    if structure is None:
        return mu.sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function=mask_function,
                            attention_mask=attention_mask, local_size=local_size, allow_is_causal_skip=False,
                            allow_is_bidirectional_skip=False, **kwargs)
    if padding is None or bool(padding.all()):
        return _structured(torch.ones(1, 1, 1, kv_length, dtype=torch.bool, device=kwargs.get("device", "cpu")),
                           structure)
    return _structured(padding.bool()[:, None, None, :], dataclasses.replace(structure, padded=True))


def _softcap(cap: float, bias: Tensor | None = None) -> ScoreMod:
    """Gemma 2's attention logit softcapping as a score_mod, in eager's order: cap * tanh(score / cap),
    then an additive mask ``bias`` ((B|1, H|1, L|1, S) or (L, S)) if given, indexed with
    FlexAttention's broadcast index tensors."""
    if bias is None:
        return lambda score, b, h, q_idx, kv_idx: torch.tanh(score / cap) * cap
    bias = bias if bias.dim() == 4 else bias[None, None]

    def softcap_then_add(score, b, h, q_idx, kv_idx):
        index = [x if size > 1 else torch.zeros_like(x) for x, size in zip((b, h, q_idx), bias.shape[:3])]
        return torch.tanh(score / cap) * cap + bias[index[0], index[1], index[2], kv_idx].to(score.dtype)

    return softcap_then_add


def attnkit_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """transformers' attention-function signature: query (B, H, L, E), key/value (B, Hkv, S, E),
    ``attention_mask`` boolean (True = attend) or additive float, broadcastable to (B, H, L, S);
    returns the output as (B, L, H, Ev) and the weights (B, H, L, S) when ``output_attentions``.

    The mask decides the structure: a :class:`StructuredMask` from :func:`attnkit_mask` carries
    proved causality, window and padding; any other mask (transformers' own, or a user's 4D mask
    of any shape) is applied exactly as given, with nothing added; no mask at all means what it
    means to transformers' SDPA function (causal top-left if the module is causal and L > 1).
    ``softcap`` (Gemma 2) becomes a score_mod; ``s_aux`` / ``sinks`` (gpt-oss) attnkit's sinks."""
    owner = type(module).__name__
    L, S = query.shape[2], key.shape[2]
    mask = bias = None
    causal, window, align = False, None, "top-left"
    if isinstance(attention_mask, StructuredMask):
        structure = attention_mask.structure
        if structure is None:
            raise UnsupportedFeature(f"{owner}: the model changed the mask attnkit built before passing it to attention "
                                     "(sliced, combined or concatenated it), so attnkit cannot prove what it holds")
        if attention_mask.shape[-1] != S:
            raise UnsupportedFeature(f"{owner}: attnkit's mask covers {attention_mask.shape[-1]} keys but attention got "
                                     f"{S}; this family's cache or mask differs from what attnkit verified")
        mask = attention_mask.as_subclass(Tensor) if structure.padded else None
        causal, window, align = structure.is_causal, structure.window, structure.causal_align
    elif attention_mask is not None:
        if attention_mask.shape[-1] < S:
            raise UnsupportedFeature(f"{owner}: a mask over {attention_mask.shape[-1]} keys for {S} keys")
        attention_mask = attention_mask[..., :S]  # as eager: a mask as long as a static cache is cut to the keys
        if attention_mask.dtype == torch.bool:
            mask = attention_mask
        else:
            bias = attention_mask.to(query.dtype)
    else:  # transformers' SDPA semantics for "no mask": causal (top-left) where the module is
        causal = L > 1 and bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    position_bias = kwargs.get("position_bias")
    if position_bias is not None:  # T5: relative position bias, (1|B, H, L, S), added to the scores
        position_bias = position_bias[..., :S].to(query.dtype)
        if mask is not None:
            position_bias = position_bias.masked_fill(~mask, float("-inf"))
            mask = None
        bias = position_bias if bias is None else bias + position_bias
    score_mod = None
    softcap = kwargs.get("softcap")
    if softcap:
        score_mod = _softcap(float(softcap), bias)
        bias = None  # eager adds an additive mask after the cap: so does the score_mod
    sinks = kwargs.get("s_aux")
    sinks = kwargs.get("sinks") if sinks is None else sinks
    recording = _RECORDING.get()
    wanted = recording.heads_of(module) if recording is not None else None
    result = attention(
        query,
        key,
        value,
        mask=mask,
        bias=bias,
        is_causal=causal,
        causal_align=align,
        window=window,
        scale=scaling,
        dropout_p=dropout if module.training else 0.0,
        need_weights=wanted if wanted is not None else _weights_requested(kwargs),
        score_mod=score_mod,
        sinks=None if sinks is None else sinks.to(query.dtype if query.dtype == torch.float64 else torch.float32),
    )
    weights = result.weights
    if wanted is not None and recording is not None and weights is not None:
        recording.store(module, weights)
        weights = weights if _weights_requested(kwargs) else None
    return result.output.transpose(1, 2).contiguous(), weights


def _weights_requested(kwargs: dict) -> bool:
    """Whether the caller asked for attention weights: ``output_attentions`` in the call, or
    transformers' output collector gathering attentions (some families, GPT-2 among them, drop the
    keyword before it reaches the attention function)."""
    if kwargs.get("output_attentions"):
        return True
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # an older or newer transformers without the collector: only the keyword counts
        return False
    collected = _active_collector.get()
    return bool(collected) and any(key.endswith("attentions") for key in collected)


@dataclass
class Recording:
    """What :func:`record` captured: per attention module (by its name in the model) the weights
    (B, len(heads), L, S) of every call, in call order (one per forward; one per step in generation)."""

    heads: dict[int, list[int]]  # id(module) -> heads to capture
    names: dict[int, str]
    weights: dict[str, list[Tensor]] = field(default_factory=dict)

    def heads_of(self, module: nn.Module) -> list[int] | None:
        return self.heads.get(id(module))

    def store(self, module: nn.Module, weights: Tensor) -> None:
        self.weights.setdefault(self.names[id(module)], []).append(weights.detach())


_RECORDING: contextvars.ContextVar[Recording | None] = contextvars.ContextVar("attnkit_hf_recording", default=None)


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The attention modules of a transformers model, in ``named_modules`` order: the innermost
    modules whose class name ends in "Attention" (BertSelfAttention, not the BertAttention that
    wraps it; LlamaAttention; BartAttention for self and cross attention alike)."""
    candidates = [(name, m) for name, m in model.named_modules() if type(m).__name__.endswith("Attention")]
    chosen = {id(m) for _, m in candidates}
    return [(name, m) for name, m in candidates
            if not any(id(inner) in chosen for inner in m.modules() if inner is not m)]


@contextlib.contextmanager
def record(model: nn.Module, *, layers: Sequence[int] | None = None, heads: Sequence[int] | None = None
           ) -> Iterator[Recording]:
    """Capture the exact attention weights of the chosen heads of the chosen attention modules only
    (indices into :func:`attention_modules`; all when None), while every output stays on attnkit's
    fast path: a head's weights cost that head's (B, 1, L, S), not the whole layer's.

        with attnkit.hf.record(model, layers=[3], heads=[5]) as rec:
            model(**inputs)
        rec.weights  # {"model.layers.3.self_attn": [tensor (B, 1, L, S)]}
    """
    modules = attention_modules(model)
    if getattr(model.config, "_attn_implementation", None) != IMPLEMENTATION:
        raise ValueError(f"record() needs a model loaded with attn_implementation={IMPLEMENTATION!r}, this one uses "
                         f"{getattr(model.config, '_attn_implementation', None)!r}")
    chosen = range(len(modules)) if layers is None else list(layers)
    bad = [i for i in chosen if not (isinstance(i, int) and 0 <= i < len(modules))]
    if bad:
        raise ValueError(f"layers must index the model's {len(modules)} attention modules, got {bad}")
    head_list = None if heads is None else [int(h) for h in heads]
    selected = {id(modules[i][1]): head_list for i in chosen}
    recording = Recording(heads={k: (v if v is not None else _all_heads(modules, k)) for k, v in selected.items()},
                          names={id(m): name for name, m in modules})
    token = _RECORDING.set(recording)
    try:
        yield recording
    finally:
        _RECORDING.reset(token)


def _all_heads(modules, module_id: int) -> list[int]:
    module = next(m for _, m in modules if id(m) == module_id)
    config = getattr(module, "config", None)
    count = getattr(module, "num_heads", None) or getattr(config, "num_attention_heads", None)
    if count is None:
        raise ValueError(f"cannot tell how many heads {type(module).__name__} has; pass heads=[...]")
    return list(range(int(count)))


def __getattr__(name: str):  # old names, one release
    if name == "FAMILIES":
        warnings.warn("attnkit.hf.FAMILIES is now attnkit.hf.VERIFIED_FAMILIES", DeprecationWarning, stacklevel=2)
        return VERIFIED_FAMILIES
    if name in ("InspectedModel", "seq2seq_attentions", "load_gguf_for_inspection", "load_for_inspection"):
        warnings.warn(f"attnkit.hf.{name} is now attnkit.inspect.hf_models.{name}", FutureWarning, stacklevel=2)
        return getattr(importlib.import_module("attnkit.inspect.hf_models"), name)  # a shim, not a dependency
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
