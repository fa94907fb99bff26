"""Every fenced Python block in the README and docs/ runs as written, so that a renamed function or a
missing import fails here rather than in a reader's hands. A block whose first line says
``# not run as written: <why>`` (its placeholders are the reader's: a path, inputs, a torchrun launch)
must say why and compile; every other block is executed, each in a fresh namespace."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = "# not run as written:"


def _blocks() -> list[tuple[str, int, str]]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(r"```python\n(.*?)```", text, re.S):
            line = text[: match.start()].count("\n") + 1
            found.append((page.relative_to(ROOT).as_posix(), line, match.group(1)))
    return found


BLOCKS = _blocks()
NEEDS = {"docs/models.md": ("minilm", "smollm2"), "README.md": ("minilm",)}
"""Pages whose blocks load real weights from the packages the set-up installs."""
SLOW = {*NEEDS, "docs/sparse.md", "docs/serving.md"}
"""Pages whose blocks take seconds (real weights, sparse attention at length): the slow tier."""
CASES = [pytest.param(page, line, code, id=f"{page}:{line}",
                      marks=([pytest.mark.requires(*NEEDS[page])] if page in NEEDS else [])
                      + ([pytest.mark.slow] if page in SLOW else []))
         for page, line, code in BLOCKS]


def test_the_pages_have_their_blocks():
    assert len(BLOCKS) >= 7
    assert {page for page, _, _ in BLOCKS} >= {"README.md", "docs/api.md", "docs/sparse.md", "docs/hf.md"}


@pytest.mark.parametrize(("page", "line", "code"), CASES)
def test_every_python_block_runs_as_written(page, line, code, monkeypatch):
    compiled = compile(code, f"{page}:{line}", "exec")
    if code.startswith(NOT_RUN):
        reason = code.splitlines()[0][len(NOT_RUN):].strip()
        assert len(reason) > 10, f"{page}:{line}: say why the block is not run"
        return
    torch.manual_seed(0)
    # A module of its own in sys.modules: torch.compile (under flex_attention's eager path too) looks up the
    # module of the functions it traces.
    module = types.ModuleType(f"docs_block_{line}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compiled, module.__dict__)  # noqa: S102 - our own pages
