"""The linear functions' ``backend=`` (attnkit.functional.linear.kernels): which calls go to flash-linear-attention's
kernels, the refusals by name, and fla's kernels themselves run on the CPU under Triton's interpreter (a child run
of tests/interpreted/fla_checks.py). The same calls on CUDA: tests/gpu/test_linear_cuda.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnkit.functional.linear import gated_delta_rule, gated_linear_attention, implicit_attention, kernels, ssd

from helpers import FLA_SITE

INTERPRETED = Path(__file__).resolve().parents[1] / "interpreted"


def _inputs(dtype=torch.float32, length=8):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, length, 4, generator=g, dtype=dtype) for _ in range(3))
    return q, k, v, -torch.rand(1, 2, length, generator=g, dtype=dtype), torch.rand(1, 2, length, generator=g,
                                                                                 dtype=dtype)


def test_a_backend_outside_the_three_is_refused_by_name():
    q, k, v, g, beta = _inputs()
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'torch', 'fla', got 'triton'"):
        gated_delta_rule(q, k, v, g, beta, backend="triton")
    with pytest.raises(ValueError, match="backend must be one of"):
        gated_linear_attention(q, k, v, g, backend="cuda")


def test_auto_on_the_cpu_is_attnkits_form_even_with_fla_installed(monkeypatch):
    monkeypatch.setattr(kernels, "fla_installed", lambda: True)
    q, k, v, g, beta = _inputs()
    assert not kernels.uses_fla("auto", q, k, v, 64)
    ours = gated_delta_rule(q, k, v, g, beta, output_final_state=True)  # would fail in fla's import if dispatched
    torch_form = gated_delta_rule(q, k, v, g, beta, output_final_state=True, backend="torch")
    torch.testing.assert_close(ours.output, torch_form.output, rtol=0, atol=0)


def test_fla_without_fla_core_names_the_extra(monkeypatch):
    monkeypatch.setattr(kernels, "fla_installed", lambda: False)
    q, k, v, g, beta = _inputs()
    with pytest.raises(ImportError, match=r"pip install 'attnkit\[fla\]'"):
        gated_delta_rule(q, k, v, g, beta, backend="fla")


@pytest.mark.parametrize("dtypes", [(torch.float64,) * 3, (torch.float32, torch.float32, torch.bfloat16)],
                         ids=["float64", "mixed"])
def test_fla_refuses_a_dtype_its_kernels_do_not_take(monkeypatch, dtypes):
    monkeypatch.setattr(kernels, "fla_installed", lambda: True)
    q, k, v, g, beta = _inputs(torch.float64)
    q, k, v = (x.to(dtype) for x, dtype in zip((q, k, v), dtypes))
    with pytest.raises(ValueError, match="backend='fla' takes q, k and v of one dtype among float16, bfloat16 and "
                                         "float32, got"):
        gated_linear_attention(q, k, v, g, backend="fla")


def test_fla_on_the_cpu_is_refused_outside_tritons_interpreter(monkeypatch):
    monkeypatch.setattr(kernels, "fla_installed", lambda: True)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x, dt = torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8)
    B = C = torch.randn(1, 1, 8, 4)
    with pytest.raises(ValueError, match="q must be on a CUDA device, got cpu"):
        ssd(x, dt, -torch.rand(2), B, C, backend="fla")


def test_the_implicit_attention_matrix_is_attnkits_form(monkeypatch):
    """The matrix is read for inspection, exact: never a kernel's (whose values would be an L x L float32 identity)."""
    def refuse(backend, *args):
        assert backend == "torch"
        return False

    monkeypatch.setattr(kernels, "uses_fla", refuse)
    monkeypatch.setattr("attnkit.functional.linear.delta.uses_fla", refuse)
    q, k, v, g, beta = _inputs()
    assert implicit_attention(q, k, g, beta).shape == (1, 2, 8, 8)
    assert implicit_attention(q, k, g, None).shape == (1, 2, 8, 8)


@pytest.mark.slow
@pytest.mark.requires("fla")
def test_fla_kernels_under_tritons_interpreter_equal_the_float64_recurrence():
    """tests/interpreted/fla_checks.py in a child pytest, fla and Triton on its path only (helpers.FLA_SITE)."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore",
               PYTHONPATH=os.pathsep.join([str(FLA_SITE), str(INTERPRETED), os.environ.get("PYTHONPATH", "")]))
    env.pop("PYTEST_XDIST_WORKER", None)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             str(INTERPRETED / "fla_checks.py")], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-2000:]
