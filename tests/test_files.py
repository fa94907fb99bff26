"""Atomic writes: nothing half-written after an error, and files get the usual mode (not mkstemp's 0600)."""

from __future__ import annotations

import os
import stat

import pytest

from attnkit._files import atomic_path, read_json, write_json


def test_failed_write_leaves_nothing_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "a.json"
    write_json(path, {"done": 1})
    with pytest.raises(RuntimeError):
        with atomic_path(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash")
    assert read_json(path) == {"done": 1} and sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_written_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        write_json(tmp_path / "b.json", [1])
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "b.json").stat().st_mode) == 0o644


def test_json_has_no_nan_a_non_finite_number_is_null(tmp_path):
    import json
    import math

    from attnkit._files import write_json

    path = tmp_path / "x.json"
    write_json(path, {"ratio": math.nan, "rows": [1.5, math.inf, {"low": -math.inf}], "pair": (1, math.nan)})
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"ratio": None, "rows": [1.5, None, {"low": None}], "pair": [1, None]}
