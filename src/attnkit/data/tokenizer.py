"""Tokenisers: subword (BPE) or word-level, built on the ``tokenizers`` package.

Both split text the same way first: a word starts with "▁" (Metaspace, as in SentencePiece) and
punctuation is split off, so "l'abîme." becomes "▁l", "'", "abîme", "." and decoding restores the
original spacing exactly. Ids 0-3 are the special tokens <pad>, <unk>, <bos>, <eos>.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from .._files import atomic_path
from ..errors import InputError

__all__ = ["Tokenizer", "SPECIALS", "PAD", "UNK", "BOS", "EOS", "KINDS"]

SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>")
PAD, UNK, BOS, EOS = range(4)  # PAD equals attnkit.models.config.PAD_ID (tested)
KINDS = ("bpe", "word")


class Tokenizer:
    """Text <-> ids. Train with :meth:`train`, save with :meth:`save`, load with :meth:`load`."""

    def __init__(self, backend) -> None:
        self._backend = backend
        for id_, token in enumerate(SPECIALS):
            if backend.token_to_id(token) != id_:
                raise ValueError(f"tokenizer must map {token!r} to id {id_}, got {backend.token_to_id(token)}")

    @classmethod
    def train(cls, texts: Iterable[str], *, kind: str = "bpe", vocab_size: int = 4000, min_frequency: int = 2) -> Tokenizer:
        """Learn a vocabulary of at most ``vocab_size`` entries (specials included) from ``texts``."""
        from tokenizers import Tokenizer as Backend
        from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if vocab_size < len(SPECIALS) + 1:
            raise ValueError(f"vocab_size must be > {len(SPECIALS)}, got {vocab_size}")
        if kind == "bpe":
            backend = Backend(models.BPE(unk_token="<unk>"))
            trainer: trainers.Trainer = trainers.BpeTrainer(
                vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIALS), show_progress=False
            )
        else:
            backend = Backend(models.WordLevel(unk_token="<unk>"))
            trainer = trainers.WordLevelTrainer(
                vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIALS), show_progress=False
            )
        backend.normalizer = normalizers.NFC()
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation(behavior="isolated")]
        )
        backend.decoder = decoders.Metaspace()
        backend.train_from_iterator(list(texts), trainer=trainer)
        return cls(backend)

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size()

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        ids = self._backend.encode(text).ids
        return ([BOS] if bos else []) + ids + ([EOS] if eos else [])

    def encode_batch(self, texts: Sequence[str], *, bos: bool = False, eos: bool = False) -> list[list[int]]:
        head, tail = [BOS] if bos else [], [EOS] if eos else []
        return [head + e.ids + tail for e in self._backend.encode_batch(list(texts))]

    def tokens(self, text: str) -> list[str]:
        """The subword pieces of ``text`` (for heatmap labels)."""
        return self._backend.encode(text).tokens

    def word_ids(self, text: str) -> list[int]:
        """For each piece of ``encode(text)``, the index of the space-separated word it lies in.

        A piece that is only the word-start marker "▁" belongs to the word that follows it.
        """
        word_of_char, word = [], -1
        for i, char in enumerate(text):
            if not char.isspace() and (i == 0 or text[i - 1].isspace()):
                word += 1
            word_of_char.append(word)
        # Spaces belong to the next word: walk backwards carrying the following word's index.
        following = word + 1
        for i in range(len(text) - 1, -1, -1):
            if text[i].isspace():
                word_of_char[i] = following
            else:
                following = word_of_char[i]
        return [word_of_char[start] if start < len(text) else word for start, _ in self._backend.encode(text).offsets]

    def id_to_token(self, id_: int) -> str:
        return self._backend.id_to_token(id_)

    def decode(self, ids: Sequence[int]) -> str:
        """Ids to text; stops at the first <eos> and drops <pad>/<bos>."""
        kept = []
        for id_ in ids:
            if id_ == EOS:
                break
            if id_ not in (PAD, BOS):
                kept.append(int(id_))
        return self._backend.decode(kept)

    def to_json(self) -> str:
        return self._backend.to_str()

    @classmethod
    def from_json(cls, text: str) -> Tokenizer:
        from tokenizers import Tokenizer as Backend

        try:
            return cls(Backend.from_str(text))
        except Exception as error:  # the Rust side raises its own exception type
            raise ValueError(f"not a valid tokenizer JSON: {error}") from error

    def save(self, path: str | os.PathLike) -> None:
        with atomic_path(path) as tmp:
            Path(tmp).write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike) -> Tokenizer:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        text = path.read_text(encoding="utf-8")
        try:
            json.loads(text)
        except json.JSONDecodeError as error:
            raise InputError(f"{path}: not valid JSON ({error})") from error
        return cls.from_json(text)
