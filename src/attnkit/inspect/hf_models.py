"""Hugging Face models for ``attnkit inspect``: a transformers encoder or decoder seen through
attnkit's encoder interface (:class:`InspectedModel`), an encoder-decoder's three attentions on one
text (:func:`seq2seq_attentions`), and the loaders that build them from a Hugging Face folder or a
GGUF file with ``attn_implementation="attnkit"`` (the bridge in :mod:`attnkit.hf`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import InputError
from ..hf import IMPLEMENTATION, VERIFIED_FAMILIES, UnsupportedFeature, UnverifiedFamily, register

__all__ = ["InspectedModel", "InspectedDecoder", "seq2seq_attentions", "load_gguf_for_inspection",
           "load_for_inspection"]


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

    model: Any  # a transformers PreTrainedModel

    def __init__(self, model: Any):
        super().__init__()
        self.model = model
        self.embeddings = _Embeddings(model.get_input_embeddings())
        import inspect as _inspect

        self._takes_types = "token_type_ids" in _inspect.signature(model.forward).parameters

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                *, need_weights: bool = False):
        from ..models.outputs import EncoderOutput

        extra = {"token_type_ids": token_type_ids} if self._takes_types and token_type_ids is not None else {}
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, output_attentions=need_weights,
                         output_hidden_states=True, use_cache=False, **extra)
        attentions = list(out.attentions) if need_weights else None
        return EncoderOutput(out.hidden_states[-1], None, attentions)


class InspectedDecoder(nn.Module):
    """One of attnkit's native decoders (a hybrid of linear and softmax attention among them) seen through the
    interface of :class:`~attnkit.models.EncoderModel`, as :class:`InspectedModel` sees a transformers model: every
    layer's attention, a softmax layer's weights and a linear layer's implicit attention matrix alike (its
    ``need_weights``), numbered as the model numbers its layers; a layer that mixes no tokens (Nemotron-H's MLP and
    expert layers) has none and is left out, so the numbers then count the layers that attend.
    ``embeddings.tokens`` is its input embedding."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        tokens = next((getattr(model, name) for name in ("embed_tokens", "tokens", "embeddings")
                       if isinstance(getattr(model, name, None), nn.Embedding)), None)
        if tokens is None:
            raise TypeError(f"{type(model).__name__} has no token embedding (an nn.Embedding: embed_tokens, tokens or "
                            "embeddings) to inspect through")
        self.embeddings = _Embeddings(tokens)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                *, need_weights: bool = False):
        from ..models.outputs import EncoderOutput

        out = self.model(input_ids, attention_mask, need_weights=need_weights)
        attentions = [a for a in out.attentions if a is not None] if need_weights else None
        return EncoderOutput(out.hidden_states, None, attentions)


def seq2seq_attentions(model: Any, tokenizer, text: str, reference: str | None = None,
                       *, max_new_tokens: int = 64) -> dict:
    """Attention of a transformers encoder-decoder on one source text, with the reference (or the
    model's own greedy output) forced through it: encoder self, decoder self and cross attention,
    each (layers, H, L, S), and the tokens of each side. Runs with ``attn_implementation="attnkit"``."""
    source = tokenizer.encode(text)
    ids = torch.tensor([source.ids], device=model.device)
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
        decoder_inputs = torch.tensor([[start, *target[:-1]]], device=model.device)
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), decoder_input_ids=decoder_inputs,
                    output_attentions=True, use_cache=False)
    stack = lambda attentions: torch.stack([a[0] for a in attentions]).float().cpu()  # noqa: E731
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

    import transformers
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from ..models.gguf import gguf_tokenizer, read_gguf

    path = Path(path)
    register()
    with _gguf_parsed_once():
        reader = read_gguf(path)  # first: a missing or unreadable file named; transformers' reads then reuse it
        meta = load_gguf_checkpoint(str(path))
        config = transformers.LlamaConfig(**meta["config"])
        model = transformers.LlamaModel._from_config(config, attn_implementation=IMPLEMENTATION).eval()
        tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
        model.load_state_dict({k.removeprefix("model."): v for k, v in tensors.items() if k != "lm_head.weight"},
                              strict=True)

    def field(name: str, default=None):
        value = reader.fields.get(name)
        return default if value is None else value.contents()

    return InspectedModel(model), gguf_tokenizer(field), "decoder"


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """Within the block, ``gguf.GGUFReader(path)`` parses each file once and ``gguf.get_tensor_name_map(arch,
    layers)`` is built once per arguments. transformers' GGUF loading (``load_gguf_checkpoint``, called once for the
    config and again for the tensors, as ``from_pretrained(gguf_file=...)`` calls it) parses the whole file each
    time and builds the name map once per submodule, 395 times for SmolLM2, most of its load's time. The reader
    and the map are read-only (a memory map, a lookup table), so a shared one gives the same tensors; transformers
    imports both names from ``gguf`` inside its functions, where the block's stand-ins are found. One thread at a
    time runs the block (another waits), so that the module is itself again after the last one."""
    import functools

    import gguf

    with _GGUF_PATCHED:
        reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        readers: dict[tuple, Any] = {}

        def one_reader(path, mode="r"):
            key = (str(path), mode)
            if key not in readers:
                readers[key] = reader(path, mode)
            return readers[key]

        originals = {"GGUFReader": reader, "get_tensor_name_map": name_map}
        stand_ins = {"GGUFReader": one_reader, "get_tensor_name_map": functools.lru_cache(maxsize=None)(name_map)}
        for name, stand_in in stand_ins.items():
            setattr(gguf, name, stand_in)
        try:
            yield
        finally:
            for name, original in originals.items():
                setattr(gguf, name, original)


_GGUF_PATCHED = threading.RLock()
"""Held while :func:`_gguf_parsed_once` has the ``gguf`` module's stand-ins in place (re-entrant: a nested block
keeps the outer one's)."""


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


NATIVE_HYBRIDS = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "kimi_linear", "minimax", "mamba2", "bamba",
                  "granitemoehybrid", "nemotron_h", "falcon_h1")
"""Hybrid and state-space families ``attnkit inspect`` loads natively (:func:`attnkit.models.pretrained.load_hf_folder`): through
transformers only their softmax layers would report attention."""


def load_for_inspection(folder) -> tuple[nn.Module, object, str]:
    """(model, ``tokenizers.Tokenizer``, kind) from a Hugging Face folder (config.json, safetensors,
    tokenizer.json) of a claimed family, loaded with ``attn_implementation="attnkit"`` (a hybrid of
    :data:`NATIVE_HYBRIDS` natively, as an :class:`InspectedDecoder`); kind is
    "encoder", "decoder" (both as an :class:`InspectedModel`) or "encoder-decoder" (the
    transformers model itself, for :func:`seq2seq_attentions`)."""
    from pathlib import Path

    from tokenizers import Tokenizer
    from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

    from .._files import read_json

    folder = Path(folder)
    config = read_json(folder / "config.json", "Hugging Face config")
    family = config.get("model_type") if isinstance(config, dict) else None
    if family in NATIVE_HYBRIDS:  # attnkit's own model: its linear layers' implicit attention is read too
        if not (folder / "tokenizer.json").is_file():
            raise FileNotFoundError(f"{folder}: no tokenizer.json (a fast tokenizer file) to tokenise the texts")
        from ..models.pretrained import load_hf_folder

        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        tokenizer.no_padding()
        tokenizer.no_truncation()
        return InspectedDecoder(load_hf_folder(folder).float().eval()), tokenizer, "decoder"
    if family not in VERIFIED_FAMILIES:
        raise UnverifiedFamily(f"{folder}: model_type {family!r} is not one of the {len(VERIFIED_FAMILIES)} families "
                               "attnkit has verified (attnkit.hf.VERIFIED_FAMILIES)")
    if not (folder / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{folder}: no tokenizer.json (a fast tokenizer file) to tokenise the texts")
    if family == "whisper":
        raise UnsupportedFeature(f"{folder}: whisper takes audio features, not text; its attention runs through "
                                 "attnkit (attnkit.hf) but `attnkit inspect` reads texts")
    if not (folder / "model.safetensors").is_file() and not any(folder.glob("model-*-of-*.safetensors")):
        raise InputError(f"{folder}: no model.safetensors; attnkit loads weights from safetensors only (a pickle "
                         "file can run code when loaded)")
    register()
    try:
        hf_config = AutoConfig.from_pretrained(folder, local_files_only=True)
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as error:  # a user's damaged files: one line naming them, not a traceback
        raise InputError(f"{folder}: cannot read its config.json or tokenizer.json ({type(error).__name__}: "
                         f"{str(error)[:200]})") from error
    tokenizer.no_padding()
    tokenizer.no_truncation()
    loader = AutoModelForSeq2SeqLM if getattr(hf_config, "is_encoder_decoder", False) else AutoModel
    try:
        with _quiet_transformers():  # its load report and bars: attnkit says what matters in one line
            model, info = loader.from_pretrained(folder, config=hf_config, attn_implementation=IMPLEMENTATION,
                                                 local_files_only=True, use_safetensors=True, output_loading_info=True)
    except UnsupportedFeature:
        raise
    except Exception as error:  # truncated or mislabelled safetensors, sizes that do not match the config
        raise InputError(f"{folder}: cannot load its weights ({type(error).__name__}: {str(error)[:200]})") from error
    missing = [k for k in info.get("missing_keys", []) if not k.startswith("pooler.")]  # unused by attention
    missing += [str(m) for m in info.get("mismatched_keys", [])]
    if missing:
        raise InputError(f"{folder}: the weights do not fill the model ({len(missing)} tensors missing or of another "
                         f"size, e.g. {', '.join(missing[:3])}); transformers would initialise them at random")
    model = model.float().eval()
    if getattr(hf_config, "is_encoder_decoder", False):
        return model, tokenizer, "encoder-decoder"
    kind = "encoder" if VERIFIED_FAMILIES[family] == "encoder" else "decoder"
    return InspectedModel(model), tokenizer, kind
