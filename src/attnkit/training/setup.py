"""What a new translation run starts from: tokenisers learnt on the training pairs (once, on the
first process, and shared, so that every data-parallel rank has the same ids) and the model its
options describe."""

from __future__ import annotations

from collections.abc import Sequence

from ..data import Pair, Tokenizer
from ..models import Seq2SeqConfig, build_model, preset
from .distributed import broadcast_text, is_main

__all__ = ["build_tokenizers", "shared_tokenizers", "new_translation_model"]


def build_tokenizers(pairs: Sequence[Pair], *, kind: str = "bpe", vocab_size: int = 4000) -> tuple[Tokenizer, Tokenizer]:
    """Source and target tokenisers learnt on the training pairs."""
    source = Tokenizer.train([p.source for p in pairs], kind=kind, vocab_size=vocab_size)
    target = Tokenizer.train([p.target for p in pairs], kind=kind, vocab_size=vocab_size)
    return source, target


def shared_tokenizers(pairs: Sequence[Pair], *, kind: str, vocab_size: int) -> tuple[Tokenizer, Tokenizer]:
    """:func:`build_tokenizers` on the first process, sent to the others (torchrun): one set of ids."""
    texts = None
    if is_main():
        source, target = build_tokenizers(pairs, kind=kind, vocab_size=vocab_size)
        texts = source.to_json() + "\0" + target.to_json()
    source_json, target_json = broadcast_text(texts).split("\0")
    return Tokenizer.from_json(source_json), Tokenizer.from_json(target_json)


def new_translation_model(source: Tokenizer, target: Tokenizer, *, arch: str, dropout: float, preset_name: str | None = None,
                          attention: str = "bahdanau", cell: str = "gru", embedding_dim: int = 128,
                          hidden_size: int = 256, layers: int = 1):
    """A fresh model for these tokenisers: ``arch="transformer"`` from a preset, or an RNN seq2seq
    (``arch="seq2seq"``) with the given attention, cell and sizes."""
    if arch == "transformer":
        return build_model(preset(preset_name or "transformer-small", source_vocab=source.vocab_size,
                                  target_vocab=target.vocab_size, dropout=dropout))
    config = Seq2SeqConfig(source.vocab_size, target.vocab_size, attention=attention, cell=cell,
                           embedding_dim=embedding_dim, hidden_size=hidden_size, num_layers=layers, dropout=dropout)
    return build_model(config)
