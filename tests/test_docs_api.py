"""docs/semantics.md's glossary and docs/api.md checked against the code: every name the glossary
lists is a parameter (or field) of every callable its row names, and every name docs/api.md lists
in a module is there."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _resolve(dotted: str):
    """The object at a dotted path such as ``attnkit.MultiHeadAttention.forward`` (modules imported)."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            target = getattr(target, attribute)
        return target
    raise ImportError(dotted)


def _names_of(target) -> set[str]:
    """Parameters of a function; for a class, of its __init__ and forward, and its fields."""
    if not inspect.isclass(target):
        return set(inspect.signature(target).parameters)
    names = set(getattr(target, "_fields", ()))
    if dataclasses.is_dataclass(target):
        names |= {field.name for field in dataclasses.fields(target)}
    for method in ("__init__", "forward"):
        if method in vars(target) or any(method in vars(base) for base in target.__mro__[1:-1]):
            names |= set(inspect.signature(getattr(target, method)).parameters)
    return names


def _table(text: str, heading: str) -> list[list[str]]:
    """The rows (cells) of the first table after ``heading``, header and rule left out."""
    section = text.split(heading, 1)[1]
    rows = []
    for line in section.splitlines():
        if line.startswith("|"):
            rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))])
        elif rows:
            break
    return rows[2:]


GLOSSARY = _table((DOCS / "semantics.md").read_text(encoding="utf-8"), "## Glossary")
CHECKS = [(name, where) for row in GLOSSARY for name in re.findall(r"`([A-Za-z_]+)`", row[0])
          for where in re.findall(r"`(attnkit\.[\w.]+)`", row[2])]


def test_the_glossary_is_read_whole():
    assert len(GLOSSARY) >= 25 and len(CHECKS) >= 90
    assert {"mask", "key_mask", "window", "width", "half_width", "causal_align", "head_dim"} <= {n for n, _ in CHECKS}


@pytest.mark.parametrize("name, where", CHECKS, ids=[f"{n}@{w}" for n, w in CHECKS])
def test_every_glossary_name_is_a_parameter_where_it_says(name, where):
    assert name in _names_of(_resolve(where)), f"{where} has no {name!r}: docs/semantics.md's glossary and the code differ"


BOX = _table((DOCS / "api.md").read_text(encoding="utf-8"), "## What is in the box")


@pytest.mark.parametrize("row", BOX, ids=[row[0] for row in BOX])
def test_every_name_in_the_box_is_in_its_module(row):
    module = importlib.import_module(re.search(r"`(attnkit[\w.]*)`", row[0]).group(1))
    names = {re.match(r"\w+", name).group(0) for name in re.findall(r"`([A-Za-z_]\w*)[^`]*`", row[1])}
    names -= {"reference", "sdpa", "tiled", "flex", "auto"}  # backend names, not attributes
    missing = sorted(name for name in names if not hasattr(module, name))
    assert not missing, f"docs/api.md lists {missing} in {module.__name__}"
    if "also top level" in row[0]:  # the names it says are top level are: split_heads was said to be, and is not
        import attnkit

        top = re.findall(r"`(\w+)`", row[0].split("(", 1)[1])
        assert top and all(hasattr(attnkit, name) for name in top), top
        assert not any(hasattr(attnkit, name) for name in ("split_heads", "merge_heads") if name in row[1]
                       and "not top level" not in row[1])
