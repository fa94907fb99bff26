"""The recorded viewers under docs/ carry today's viewer page: each equals a re-render of its own
data and title with the current viewer.html / .css / .js (`make docs` refreshes them)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VIEWERS = sorted((ROOT / "docs").rglob("viewer.html"))


def _script():
    spec = importlib.util.spec_from_file_location("refresh_viewers", ROOT / "scripts" / "refresh_viewers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", VIEWERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_recorded_viewer_is_the_current_page(path):
    page = path.read_text(encoding="utf-8")
    assert _script().rerendered(page, path) == page, f"{path} embeds an old viewer: run `make docs`"


def test_there_are_recorded_viewers():
    assert VIEWERS
