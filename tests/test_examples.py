"""Every script under examples/ runs to completion."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]  # runs the examples as scripts (the torchrun one about 80 s)

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.py"))


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(script, capsys):
    runpy.run_path(str(script), run_name="__main__")
    assert capsys.readouterr().out.strip()


def test_there_are_examples():
    assert EXAMPLES
