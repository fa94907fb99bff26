"""Model configs: frozen dataclasses, validated on construction, saved as JSON next to the weights.

Named presets reproduce the papers' tables (see :data:`PRESETS`).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import ClassVar

from .._files import read_json, write_json

__all__ = [
    "Seq2SeqConfig",
    "TransformerConfig",
    "SEQ2SEQ_ATTENTIONS",
    "PRESETS",
    "preset",
    "config_to_dict",
    "config_from_dict",
    "save_config",
    "load_config",
]

SEQ2SEQ_ATTENTIONS = ("none", "bahdanau", "luong-dot", "luong-general", "luong-concat", "luong-local-p")


def _check_positive(config, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{type(config).__name__}.{name} must be a positive int, got {value!r}")


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


_KINDS = {cls.kind: cls for cls in (Seq2SeqConfig, TransformerConfig)}

PRESETS: dict[str, object] = {
    # Vaswani et al. 2017, table 3 "base": shared 37K BPE vocabulary (WMT14 En-De).
    "transformer-base": TransformerConfig(source_vocab=37000, target_vocab=37000, share_embeddings=True),
    # Vaswani et al. 2017, table 3 "big".
    "transformer-big": TransformerConfig(source_vocab=37000, target_vocab=37000, d_model=1024, num_heads=16,
                                         d_ff=4096, dropout=0.3, share_embeddings=True),
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
    try:
        return cls(**data)
    except TypeError as error:
        raise ValueError(f"invalid {cls.__name__}: {error}") from error


def save_config(config, path: str | os.PathLike) -> None:
    write_json(path, config_to_dict(config))


def load_config(path: str | os.PathLike):
    return config_from_dict(read_json(path, "config file"))
