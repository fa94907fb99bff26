"""attnkit inside Hugging Face transformers: ``"attnkit"`` as an attention implementation.

    import attnkit.hf
    attnkit.hf.register()
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="attnkit")

Every attention call of a model whose family routes attention through transformers'
``AttentionInterface`` then runs :func:`attnkit.attention` (``backend="auto"``): grouped-query heads
without repeating K/V, masks as booleans (transformers builds them with its SDPA mask function,
which leaves out a mask that causality alone describes), T5's ``position_bias`` as an additive
bias, sliding windows given as ``sliding_window`` as a window. With ``output_attentions=True`` the
exact weights come back while the output stays on the fast backend (attnkit's weights on demand).

What a family asks for and attnkit does not implement is refused with :class:`UnsupportedFeature`
naming the model and the feature (Gemma 2's logit softcapping, attention sinks), never computed
differently. Requires the ``hf`` extra (transformers).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .functional.attention import attention

__all__ = ["IMPLEMENTATION", "FAMILIES", "register", "attnkit_attention_forward", "attnkit_mask", "record",
           "Recording", "attention_modules", "UnsupportedFeature", "InspectedModel", "load_for_inspection",
           "seq2seq_attentions", "load_gguf_for_inspection"]

IMPLEMENTATION = "attnkit"
"""The name to pass as ``attn_implementation``."""

FAMILIES: dict[str, str] = {
    # model_type: what is verified against attn_implementation="eager" (tests/external/test_hf_bridge.py)
    "bert": "hidden states and weights, padding",
    "modernbert": "hidden states and weights, padding, local (windowed) and global layers",
    "gpt2": "logits, weights, padding, greedy generation with the KV cache",
    "llama": "logits, weights, padding, greedy generation with the KV cache",
    "mistral": "logits, weights, padding, sliding window, greedy generation",
    "qwen2": "logits, weights, padding, greedy generation",
    "qwen3": "logits, weights, padding, greedy generation",
    "gemma2": "logits, weights, padding, sliding window, greedy generation; attention softcapping refused",
    "gemma3": "logits, weights, padding, sliding window, greedy generation",
    "phi3": "logits, weights, padding, greedy generation",
    "smollm3": "logits, weights, padding, greedy generation",
    "olmo2": "logits, weights, padding, greedy generation",
    "bart": "logits, encoder / decoder / cross weights, padding, greedy generation",
    "marian": "logits, encoder / decoder / cross weights, padding, greedy generation",
    "t5": "logits (relative position bias), encoder / decoder / cross weights, padding, greedy generation",
    "whisper": "logits, encoder / decoder / cross weights",
}
"""The families whose attention runs through attnkit, tested family by family (README lists them)."""

# Keyword arguments families pass that change the numbers and that attnkit does not implement.
_REFUSED = {"softcap": "attention logit softcapping (Gemma 2)", "s_aux": "attention sinks (s_aux)",
            "sinks": "attention sinks"}


class UnsupportedFeature(ValueError):
    """A model asks its attention for something attnkit does not implement."""


# Families whose attention modules pass ``sliding_window`` to the attention function: for them a
# causal sliding-window mask without padding is not built at all; attnkit applies the window itself
# (and the tiled backend skips the blocks outside it).
_WINDOW_PASSED = frozenset({"mistral", "qwen2", "gemma2", "gemma3"})


def register() -> None:
    """Register ``"attnkit"`` with transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(IMPLEMENTATION, attnkit_attention_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, attnkit_mask)


def attnkit_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0, *,
                 attention_mask: Tensor | None = None, local_size: int | None = None,
                 allow_is_causal_skip: bool = True, allow_is_bidirectional_skip: bool = False, config=None,
                 **kwargs) -> Tensor | None:
    """The mask transformers asks for, with no (L, S) tensor where structure says it all.

    A plain causal or bidirectional mask (transformers allows skipping it: no extra mask function, no
    packed sequences) over a prompt without a cache is returned as its padding alone, (B, 1, 1, S),
    or None without padding; the attention function adds the structure (causality from the module,
    the window from ``sliding_window``). A sliding window only where the family passes
    ``sliding_window`` to its attention. Anything else: transformers' SDPA mask (booleans)."""
    from transformers.masking_utils import sdpa_mask

    plain = allow_is_causal_skip or allow_is_bidirectional_skip
    window_known = local_size is None or getattr(config, "model_type", None) in _WINDOW_PASSED
    if plain and window_known and config is not None and q_offset == 0 and kv_offset == 0 and q_length == kv_length:
        if attention_mask is None or bool(attention_mask.all()):
            return None
        if attention_mask.dim() == 2 and attention_mask.shape == (batch_size, kv_length):
            return attention_mask.bool()[:, None, None, :]  # (B, 1, 1, S): padding only
    return sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, attention_mask=attention_mask,
                     local_size=local_size, allow_is_causal_skip=allow_is_causal_skip,
                     allow_is_bidirectional_skip=allow_is_bidirectional_skip, config=config, **kwargs)


def _refuse_unsupported(module: nn.Module, kwargs: dict) -> None:
    for name, feature in _REFUSED.items():
        value = kwargs.get(name)
        if value is not None and value is not False:
            owner = type(module).__name__
            raise UnsupportedFeature(f"{owner} asks for {feature} ({name}={_short(value)}), which attnkit's attention "
                                     "does not implement; load this model with attn_implementation='eager' or 'sdpa'")


def _short(value) -> str:
    return f"tensor of shape {tuple(value.shape)}" if isinstance(value, Tensor) else repr(value)


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
    returns the output as (B, L, H, Ev) and the weights (B, H, L, S) when ``output_attentions``."""
    _refuse_unsupported(module, kwargs)
    L, S = query.shape[2], key.shape[2]
    mask = bias = None
    if attention_mask is not None:
        attention_mask = attention_mask[..., :S]  # some families pass a mask as long as a static cache
        if attention_mask.dtype == torch.bool:
            mask = attention_mask
        else:
            bias = attention_mask.to(query.dtype)
    position_bias = kwargs.get("position_bias")
    if position_bias is not None:  # T5: relative position bias, (1|B, H, L, S), added to the scores
        position_bias = position_bias[..., :S].to(query.dtype)
        if mask is not None:
            position_bias = position_bias.masked_fill(~mask, float("-inf"))
            mask = None
        bias = position_bias if bias is None else bias + position_bias
    causal_module = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))  # as sdpa
    # A full (B|1, 1, L, S) mask from transformers already holds causality and any window. No mask,
    # or attnkit_mask's padding-only (B, 1, 1, S) one, leaves the structure to attnkit: causality
    # from the module, the window from sliding_window (a single new token sees every cached key).
    # With a cache, query i is position S - L + i: causal bottom-right.
    structural = attention_mask is None or (attention_mask.shape[-2] == 1 and L > 1)
    causal = causal_module and structural and L > 1
    window = kwargs.get("sliding_window") if causal_module and structural else None
    window = window if window and window < S else None
    recording = _RECORDING.get()
    wanted = recording.heads_of(module) if recording is not None else None
    result = attention(
        query,
        key,
        value,
        mask=mask,
        bias=bias,
        is_causal=causal,
        causal_align="bottom-right",
        window=window,
        scale=scaling,
        dropout_p=dropout if module.training else 0.0,
        need_weights=wanted if wanted is not None else _weights_requested(kwargs),
    )
    weights = result.weights
    if wanted is not None:
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


class _Embeddings(nn.Module):
    def __init__(self, tokens: nn.Module):
        super().__init__()
        self.tokens = tokens


class InspectedModel(nn.Module):
    """A transformers encoder or decoder seen through the interface of attnkit's
    :class:`~attnkit.models.EncoderModel`, so that :func:`attnkit.inspect.report.inspect_encoder`
    (head roles, rollout, flow, viewer, attribution agreement) runs on it unchanged. A decoder gives
    its causal attention (the "causal view"). ``embeddings.tokens`` is the model's input embedding,
    which attribution hooks."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.embeddings = _Embeddings(model.get_input_embeddings())
        import inspect as _inspect

        self._takes_types = "token_type_ids" in _inspect.signature(model.forward).parameters

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                *, need_weights: bool = False):
        from .models.outputs import EncoderOutput

        extra = {"token_type_ids": token_type_ids} if self._takes_types and token_type_ids is not None else {}
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, output_attentions=need_weights,
                         output_hidden_states=True, use_cache=False, **extra)
        attentions = list(out.attentions) if need_weights else None
        return EncoderOutput(out.hidden_states[-1], None, attentions)


def seq2seq_attentions(model: nn.Module, tokenizer, text: str, reference: str | None = None,
                       *, max_new_tokens: int = 64) -> dict:
    """Attention of a transformers encoder-decoder on one source text, with the reference (or the
    model's own greedy output) forced through it: encoder self, decoder self and cross attention,
    each (layers, H, L, S), and the tokens of each side. Runs with ``attn_implementation="attnkit"``."""
    source = tokenizer.encode(text)
    ids = torch.tensor([source.ids])
    start = model.config.decoder_start_token_id
    if start is None:
        raise UnsupportedFeature(f"{type(model).__name__}: the config has no decoder_start_token_id")
    with torch.no_grad():
        if reference is None:
            generated = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                       do_sample=False)[0].tolist()
            target = [t for t in generated[1:]]  # drop the decoder start token
        else:
            target = tokenizer.encode(reference).ids
        if not target:
            raise ValueError(f"nothing to force for {text[:60]!r}: an empty output")
        decoder_inputs = torch.tensor([[start, *target[:-1]]])
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), decoder_input_ids=decoder_inputs,
                    output_attentions=True, use_cache=False)
    stack = lambda attentions: torch.stack([a[0] for a in attentions]).float()  # noqa: E731
    return {
        "keys": list(source.tokens),
        "inputs": [tokenizer.id_to_token(t) or str(t) for t in decoder_inputs[0].tolist()],
        "outputs": [tokenizer.id_to_token(t) or str(t) for t in target],
        "output_text": tokenizer.decode(target),
        "encoder": stack(out.encoder_attentions),
        "decoder": stack(out.decoder_attentions),
        "cross": stack(out.cross_attentions),
    }


def load_gguf_for_inspection(path) -> tuple[InspectedModel, object, str]:
    """(model, tokenizer, "decoder") from a Llama-architecture GGUF file (SmolLM2 as our data package
    ships it), read and dequantised by transformers' own GGUF code and run with
    ``attn_implementation="attnkit"``; the tokenizer is attnkit's, rebuilt from the GGUF vocabulary."""
    from pathlib import Path

    import gguf
    import transformers
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from .models.pretrained import _gguf_tokenizer

    path = Path(path)
    register()
    meta = load_gguf_checkpoint(str(path))
    config = transformers.LlamaConfig(**meta["config"])
    model = transformers.LlamaModel._from_config(config, attn_implementation=IMPLEMENTATION).eval()
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    model.load_state_dict({k.removeprefix("model."): v for k, v in tensors.items() if k != "lm_head.weight"},
                          strict=True)
    reader = gguf.GGUFReader(str(path))

    def field(name: str, default=None):
        value = reader.fields.get(name)
        return default if value is None else value.contents()

    return InspectedModel(model), _gguf_tokenizer(field), "decoder"


def load_for_inspection(folder) -> tuple[nn.Module, object, str]:
    """(model, ``tokenizers.Tokenizer``, kind) from a Hugging Face folder (config.json, safetensors,
    tokenizer.json) of a claimed family, loaded with ``attn_implementation="attnkit"``; kind is
    "encoder", "decoder" (both as an :class:`InspectedModel`) or "encoder-decoder" (the
    transformers model itself, for :func:`seq2seq_attentions`)."""
    from pathlib import Path

    from tokenizers import Tokenizer
    from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

    from ._files import read_json

    folder = Path(folder)
    config = read_json(folder / "config.json", "Hugging Face config")
    family = config.get("model_type") if isinstance(config, dict) else None
    if family not in FAMILIES:
        raise UnsupportedFeature(f"{folder}: model_type {family!r} is not one of the families attnkit runs "
                                 f"({', '.join(FAMILIES)})")
    if not (folder / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{folder}: no tokenizer.json (a fast tokenizer file) to tokenise the texts")
    if family == "whisper":
        raise UnsupportedFeature(f"{folder}: whisper takes audio features, not text; its attention runs through "
                                 "attnkit (attnkit.hf) but `attnkit inspect` reads texts")
    register()
    hf_config = AutoConfig.from_pretrained(folder, local_files_only=True)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    if getattr(hf_config, "is_encoder_decoder", False):
        model = AutoModelForSeq2SeqLM.from_pretrained(folder, config=hf_config, attn_implementation=IMPLEMENTATION,
                                                      local_files_only=True).float().eval()
        return model, tokenizer, "encoder-decoder"
    model = AutoModel.from_pretrained(folder, config=hf_config, attn_implementation=IMPLEMENTATION,
                                      local_files_only=True).float().eval()
    kind = "encoder" if family in ("bert", "modernbert") else "decoder"
    return InspectedModel(model), tokenizer, kind
