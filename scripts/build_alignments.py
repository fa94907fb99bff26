"""Build the bundled Greek-English word-aligned corpus (run at build time only, never at run time).

Downloads the PyPI package ``bible-alignments==0.4.2`` with pip (``--no-deps``: only its data files
are read, none of its code runs) into a temporary folder and reads three files from the wheel:

- ``data/sources/SBLGNT.tsv``: the Greek New Testament, one word a row, id ``nBBCCCVVVWWW``;
- ``data/eng/targets/BSB/nt_BSB.tsv``: the Berean Standard Bible, one token a row, id
  ``BBCCCVVVWWW``; punctuation rows are marked ``exclude`` and dropped here;
- ``data/eng/alignments/BSB/SBLGNT-BSB-manual.json``: the hand-made alignment (Scripture Burrito
  0.3), records of ``source`` word ids x ``target`` token ids.

Each record contributes every (source, target) pair of its ids as a link. Links whose English
token belongs to another verse than the Greek word (versification differences) are dropped, as
are links to excluded tokens. The output ``src/attnkit/data/corpora/sblgnt-bsb.tsv.gz`` has a
header row, then ``split<TAB>book<TAB>chapter<TAB>verse<TAB>greek<TAB>english<TAB>links``: the
words of each side joined by single spaces and the links as ``i-j`` pairs of 0-based word
indices (Greek i, English j), sorted.

    python scripts/build_alignments.py                 # download, build, write
    python scripts/build_alignments.py --wheel PATH    # use a wheel you already have
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys
import tempfile
import unicodedata
import zipfile
from collections import defaultdict
from pathlib import Path

from build_corpus import write_gzip  # scripts/ is on sys.path when this file is run

PACKAGE = "bible-alignments==0.4.2"
SOURCE = "data/sources/SBLGNT.tsv"
TARGET = "data/eng/targets/BSB/nt_BSB.tsv"
ALIGNMENT = "data/eng/alignments/BSB/SBLGNT-BSB-manual.json"
OUTPUT = Path(__file__).resolve().parents[1] / "src/attnkit/data/corpora/sblgnt-bsb.tsv.gz"
COLUMNS = ["split", "book", "chapter", "verse", "greek", "english", "links"]

# Whole books per split, so no verse leaks (book numbers: 40 Matthew ... 66 Revelation).
VALID_BOOKS = {56: "Titus", 59: "James"}
TEST_BOOKS = {41: "Mark", 50: "Philippians", 62: "1John"}


def split_of(book: int) -> str:
    if book in TEST_BOOKS:
        return "test"
    return "valid" if book in VALID_BOOKS else "train"


def download_wheel(folder: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", PACKAGE, "-d", str(folder)], check=True
    )
    (wheel,) = folder.glob("bible_alignments-*.whl")
    return wheel


def _rows(archive: zipfile.ZipFile, member: str):
    (name,) = [n for n in archive.namelist() if n.endswith(member)]
    with archive.open(name) as raw:
        yield from csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8"), delimiter="\t", quoting=csv.QUOTE_NONE)


def _word(text: str) -> str:
    return "".join(unicodedata.normalize("NFC", text).split())


def build(wheel: Path) -> tuple[str, dict[str, int]]:
    # verse id (BBCCCVVV) -> list of (token id, word); token id -> (verse, index in its verse)
    greek: dict[str, list[str]] = defaultdict(list)
    english: dict[str, list[str]] = defaultdict(list)
    position: dict[str, tuple[str, int]] = {}
    counts = defaultdict(int)
    with zipfile.ZipFile(wheel) as archive:
        for row in _rows(archive, SOURCE):
            verse = row["id"][1:9]
            position[row["id"]] = (verse, len(greek[verse]))
            greek[verse].append(_word(row["text"]))
        for row in _rows(archive, TARGET):
            if row["exclude"] == "y" or not _word(row["text"]):
                counts["english_tokens_excluded"] += 1
                continue
            verse = row["id"][:8]
            position[row["id"]] = (verse, len(english[verse]))
            english[verse].append(_word(row["text"]))
        (name,) = [n for n in archive.namelist() if n.endswith(ALIGNMENT)]
        records = json.loads(archive.read(name))["records"]
    links: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for record in records:
        for source in record["source"]:
            for target in record["target"]:
                counts["links_in_records"] += 1
                if target not in position:
                    counts["links_to_excluded_tokens"] += 1
                    continue
                (s_verse, i), (t_verse, j) = position[source], position[target]
                if s_verse != t_verse:
                    counts["links_across_verses"] += 1
                    continue
                links[s_verse].add((i, j))
    out = io.StringIO()
    out.write("\t".join(COLUMNS) + "\n")
    for verse in sorted(greek):
        if verse not in english or not links[verse]:
            counts["verses_without_english_or_links"] += 1
            continue
        book, chapter, number = int(verse[:2]), int(verse[2:5]), int(verse[5:])
        split = split_of(book)
        counts[f"{split}_verses"] += 1
        counts["links_kept"] += len(links[verse])
        pairs = " ".join(f"{i}-{j}" for i, j in sorted(links[verse]))
        out.write(f"{split}\t{book}\t{chapter}\t{number}\t{' '.join(greek[verse])}\t{' '.join(english[verse])}\t{pairs}\n")
    return out.getvalue(), dict(counts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, help="an existing bible_alignments-0.4.2 wheel (skips the download)")
    parser.add_argument("--out", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        text, counts = build(args.wheel or download_wheel(Path(tmp)))
    write_gzip(text, args.out)
    print(", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
