"""Markdown that attnkit's reports write: tables, user text escaped, files written atomically."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from ._files import atomic_path

__all__ = ["markdown_table", "escape", "write_markdown"]

_ESCAPES = str.maketrans({c: "\\" + c for c in "\\`*_[]()#!|"} | {"<": "&lt;", ">": "&gt;", "&": "&amp;"})


def markdown_table(header: Sequence[str], rows: Iterable[Sequence]) -> list[str]:
    """The lines of a Markdown table: a header row, the separator, one line per row of cells
    (formatted with ``str``); every row must have the header's number of cells."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [str(cell) for cell in row]
        if len(cells) != len(header):
            raise ValueError(f"a table row has {len(cells)} cells, the header {len(header)}: {cells}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def escape(text: str) -> str:
    """User text in a report: plain text. Markdown and HTML characters are escaped (no link, image or
    heading can be injected) and line breaks of every kind (\\r, \\n, U+2028 ...) become spaces."""
    return " ".join(text.splitlines()).translate(_ESCAPES)


def write_markdown(path: Path, lines: list[str]) -> None:
    """``lines`` joined by newlines, written atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
