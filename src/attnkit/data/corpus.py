"""Parallel corpora: the bundled English-French Bible and users' own ``source<TAB>target`` files."""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import NamedTuple

from ..errors import InputError

__all__ = ["Pair", "bible_corpus", "aligned_corpus", "read_pairs", "read_texts", "SPLITS", "LONG_SPLITS", "CorefItem", "winograd_pairs"]

SPLITS = ("train", "valid", "test")
LONG_SPLITS = ("valid-long", "test-long", "train-long")
"""The bundled Bible corpus's longer verses: 26 to 80 words (on the longer side) from the valid and
test books, and 26 to 50 words from the training books (``train-long``: with ``train`` it trains
Figure 2's "-50" models); train, valid and test hold verses of at most 25 words."""
MAX_LINE_CHARS = 10_000
"""Longest line a pairs file may have: a sentence pair, not a document (a longer line is almost
certainly a broken file, and tokenising megabytes as one sentence exhausts memory)."""
_BIBLE = "kjv-lsg.tsv.gz"
_BIBLE_COLUMNS = ["split", "book", "chapter", "verse", "english", "french"]
_ALIGNED = "sblgnt-bsb.tsv.gz"
_ALIGNED_COLUMNS = ["split", "book", "chapter", "verse", "greek", "english", "links"]


@dataclass(frozen=True)
class Pair:
    """One sentence pair; ``alignment`` lists (source word, target word) links when they are known."""

    source: str
    target: str
    reference: str = ""
    alignment: tuple[tuple[int, int], ...] | None = None


def _open_text(path: Path):
    # utf-8-sig: a byte-order mark (as Windows editors write) is not part of the first sentence.
    return gzip.open(path, "rt", encoding="utf-8-sig") if path.suffix == ".gz" else open(path, encoding="utf-8-sig")


def _bundled_rows(name: str, columns: list[str], split: str, splits: tuple[str, ...] = SPLITS):
    """The rows of one split of a bundled corpus file, as lists of fields after ``split``."""
    if split not in splits:
        raise ValueError(f"split must be one of {splits}, got {split!r}")
    path = resources.files("attnkit.data") / "corpora" / name
    with resources.as_file(path) as file, _open_text(Path(file)) as lines:
        header = next(lines).rstrip("\n").split("\t")
        if header != columns:
            raise InputError(f"{file}: expected header {columns}, got {header}")
        for row in lines:
            fields = row.rstrip("\n").split("\t")
            if fields[0] == split:
                yield fields[1:]


def bible_corpus(split: str, *, direction: str = "en-fr") -> list[Pair]:
    """The bundled KJV / Louis Segond verse pairs of one split: "train", "valid", "test" (at most 25
    words per side), "valid-long", "test-long" (26 to 80 words, the same held-out books), or
    "train-long" (26 to 50 words from the training books).

    ``direction`` is "en-fr" or "fr-en". Provenance and licence: ``attnkit/data/corpora/README.md``.
    """
    if direction not in ("en-fr", "fr-en"):
        raise ValueError(f"direction must be 'en-fr' or 'fr-en', got {direction!r}")
    pairs = []
    for book, chapter, verse, english, french in _bundled_rows(_BIBLE, _BIBLE_COLUMNS, split, SPLITS + LONG_SPLITS):
        source, target = (english, french) if direction == "en-fr" else (french, english)
        pairs.append(Pair(source, target, reference=f"{book}:{chapter}:{verse}"))
    return pairs


def aligned_corpus(split: str) -> list[Pair]:
    """The bundled word-aligned Greek New Testament (SBLGNT) -> English (Berean Standard Bible)
    verse pairs of one split, with the hand-made links in ``Pair.alignment``.

    Words are separated by single spaces (English without punctuation); a link ``(i, j)`` joins
    Greek word i and English word j (0-based). Provenance and licence: ``attnkit/data/corpora/README.md``.
    """
    pairs = []
    for book, chapter, verse, greek, english, links in _bundled_rows(_ALIGNED, _ALIGNED_COLUMNS, split):
        alignment = tuple((int(s), int(t)) for s, t in (link.split("-") for link in links.split()))
        pairs.append(Pair(greek, english, reference=f"{book}:{chapter}:{verse}", alignment=alignment))
    return pairs


class CorefItem(NamedTuple):
    """One sentence of a Winograd-style pair: ``pronoun`` refers to ``antecedent``, not ``other``."""

    pair: int
    sentence: str
    pronoun: str
    antecedent: str
    other: str


def winograd_pairs() -> list[CorefItem]:
    """The bundled Winograd-style pairs (64 pairs, 128 sentences, written for attnkit; see
    ``attnkit/data/corpora/README.md``): two sentences per pair, one word apart, whose pronoun
    refers to a different one of the same two candidates."""
    path = resources.files("attnkit.data") / "corpora" / "winograd.tsv"
    lines = path.read_text(encoding="utf-8").splitlines()
    items = []
    for line in lines[1:]:
        pair, sentence, pronoun, antecedent, other = line.split("\t")
        items.append(CorefItem(int(pair), sentence, pronoun, antecedent, other))
    return items


def read_pairs(path: str | os.PathLike) -> list[Pair]:
    """Read a ``source<TAB>target`` file (UTF-8, optionally gzipped), one pair per line.

    Blank lines are skipped. A line without exactly one tab, or with an empty side, raises
    ``ValueError`` naming the file and the line number.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"pairs file not found: {path}" + (" (it is a folder)" if path.is_dir() else ""))
    try:
        return _read_pairs(path)
    except gzip.BadGzipFile as error:
        raise InputError(f"{path}: not a gzip file although its name ends in .gz ({error})") from None
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not UTF-8 text (byte {error.start} of a line: {error.reason})") from None
    except EOFError:
        raise InputError(f"{path}: the gzip stream is truncated") from None


def _read_pairs(path: Path) -> list[Pair]:
    pairs = []
    with _open_text(path) as lines:
        for number, line in enumerate(lines, 1):
            if len(line) > MAX_LINE_CHARS:
                raise InputError(f"{path}:{number}: line of {len(line):,} characters; at most {MAX_LINE_CHARS:,} "
                                 "(one sentence pair per line)")
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
                raise InputError(f"{path}:{number}: empty {'source' if not source else 'target'} side")
            pairs.append(Pair(source, target, reference=f"{path.name}:{number}"))
    if not pairs:
        raise InputError(f"{path}: no sentence pairs found")
    return pairs


def read_texts(path: str | os.PathLike) -> tuple[list[str], list[str] | None]:
    """Texts, one per line, or ``source<TAB>reference`` lines (UTF-8, a byte-order mark dropped).

    Returns (texts, None) or (sources, references). Blank lines are skipped; an empty file, a mix
    of lines with and without a tab, or a line over :data:`MAX_LINE_CHARS` raises ``ValueError``
    naming the file.
    """
    path = Path(path)
    try:
        content = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not UTF-8 text (byte {error.start}: {error.reason})") from None
    lines = [line for line in content.splitlines() if line.strip()]
    if not lines:
        raise InputError(f"{path}: no texts in it")
    for line in lines:
        if len(line) > MAX_LINE_CHARS:
            raise InputError(f"{path}: a line of {len(line):,} characters; at most {MAX_LINE_CHARS:,}")
    tabs = ["\t" in line for line in lines]
    if all(tabs):
        pairs = read_pairs(path)
        return [p.source for p in pairs], [p.target for p in pairs]
    if any(tabs):
        raise InputError(f"{path}: either every line is 'source<TAB>reference' or none has a tab")
    return lines, None
