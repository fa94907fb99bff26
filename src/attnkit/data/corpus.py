"""Parallel corpora: the bundled English-French Bible and users' own ``source<TAB>target`` files."""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

__all__ = ["Pair", "bible_corpus", "read_pairs", "SPLITS"]

SPLITS = ("train", "valid", "test")
_BIBLE = "kjv-lsg.tsv.gz"
_BIBLE_COLUMNS = ["split", "book", "chapter", "verse", "english", "french"]


@dataclass(frozen=True)
class Pair:
    """One sentence pair; ``alignment`` lists (source word, target word) links when they are known."""

    source: str
    target: str
    reference: str = ""
    alignment: tuple[tuple[int, int], ...] | None = None


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")


def bible_corpus(split: str, *, direction: str = "en-fr") -> list[Pair]:
    """The bundled KJV / Louis Segond verse pairs of one split ("train", "valid", "test").

    ``direction`` is "en-fr" or "fr-en". Provenance and licence: ``attnkit/data/corpora/README.md``.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if direction not in ("en-fr", "fr-en"):
        raise ValueError(f"direction must be 'en-fr' or 'fr-en', got {direction!r}")
    path = resources.files("attnkit.data") / "corpora" / _BIBLE
    pairs = []
    with resources.as_file(path) as file, _open_text(Path(file)) as lines:
        header = next(lines).rstrip("\n").split("\t")
        if header != _BIBLE_COLUMNS:
            raise ValueError(f"{file}: expected header {_BIBLE_COLUMNS}, got {header}")
        for row in lines:
            name, book, chapter, verse, english, french = row.rstrip("\n").split("\t")
            if name != split:
                continue
            source, target = (english, french) if direction == "en-fr" else (french, english)
            pairs.append(Pair(source, target, reference=f"{book}:{chapter}:{verse}"))
    return pairs


def read_pairs(path: str | os.PathLike) -> list[Pair]:
    """Read a ``source<TAB>target`` file (UTF-8, optionally gzipped), one pair per line.

    Blank lines are skipped. A line without exactly one tab, or with an empty side, raises
    ``ValueError`` naming the file and the line number.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"pairs file not found: {path}")
    pairs = []
    with _open_text(path) as lines:
        for number, line in enumerate(lines, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) != 2:
                raise ValueError(
                    f"{path}:{number}: expected 'source<TAB>target' (2 tab-separated fields), got {len(fields)}"
                )
            source, target = (field.strip() for field in fields)
            if not source or not target:
                raise ValueError(f"{path}:{number}: empty {'source' if not source else 'target'} side")
            pairs.append(Pair(source, target, reference=f"{path.name}:{number}"))
    if not pairs:
        raise ValueError(f"{path}: no sentence pairs found")
    return pairs
