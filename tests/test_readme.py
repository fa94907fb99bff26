"""The README's API tour runs as written, and says what it shows: the shapes in its comments, and
incremental decoding equal to a full pass."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).parent.parent / "README.md"


@pytest.mark.requires("minilm")
def test_the_readme_api_tour_runs_and_its_comments_hold():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) == 1, "the README has one Python tour"
    torch.manual_seed(0)
    scope: dict = {}
    exec(compile(blocks[0], str(README), "exec"), scope)  # noqa: S102 - our own README
    out = scope["out"]
    assert tuple(out.output.shape) == (2, 8, 97, 64)
    assert tuple(out.weights.shape) == (2, 2, 97, 120)
    assert tuple(scope["y"].shape) == (1, 8, 4096, 64)
    assert 0 < scope["bm"].occupancy() < 0.5
    assert [tuple(step.shape) for step in scope["steps"]] == [(1, 1, 512)] * 4
