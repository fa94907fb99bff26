"""Packaging as users install it: the wheel, with no extras, in a fresh virtual environment gives a
working CLI from another folder (slow: it installs torch into the new environment)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*command, cwd=None, timeout=600):
    # bytecode written at first import, as a user's Python does (pip installs with --no-compile below)
    env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True, cwd=cwd, timeout=timeout,
                            env={**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert result.returncode == 0, f"{command}: {result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.mark.slow
def test_wheel_without_extras_in_a_fresh_environment(tmp_path):
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, ROOT)
    wheel = next(dist.glob("attnkit-*.whl"))
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    # --no-compile: pip compiles none of the installed files (most of a minute, torch's thousands of modules);
    # the commands below compile what they import. What is tested, the wheel's metadata, dependencies and entry
    # points, is the same
    _run(python, "-m", "pip", "install", "-q", "--no-compile", "torch==2.13.0")  # first: nothing may pull a CUDA build
    _run(python, "-m", "pip", "install", "-q", "--no-compile", wheel)  # no extras
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    version = _run(venv / "bin" / "attnkit", "--version", cwd=elsewhere).stdout
    from attnkit import __version__

    assert version.strip() == f"attnkit {__version__}"
    assert _run(python, "-m", "attnkit", "--version", cwd=elsewhere).stdout == version
    tour = _run(venv / "bin" / "attnkit", "tour", "--out", "tour", cwd=elsewhere, timeout=300)
    assert "heatmaps written" in tour.stdout and len(list((elsewhere / "tour").glob("*.png"))) >= 10
    cost = _run(venv / "bin" / "attnkit", "cost", "--model", "gpt2-small", "--seq", "1024", cwd=elsewhere)
    assert "parameters: 124,439,808" in cost.stdout
    typed = _run(python, "-c", "import attnkit, pathlib; print((pathlib.Path(attnkit.__file__).parent / 'py.typed').is_file())",
                 cwd=elsewhere)
    assert typed.stdout.strip() == "True"
