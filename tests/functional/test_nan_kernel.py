"""The NaN rule's one-kernel form on CUDA (attnkit.functional.nan_kernel), checked on the CPU through Triton's
interpreter against the seven-kernel form (nan.poisoned_rows and a where) row for row: dtypes, grouped heads,
query, key and value positions of a NaN, lengths across the kernel's row blocks, and the two output layouts SDPA
returns. On the GPU the same comparison runs compiled (tests/gpu/test_nan_rule_cuda.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from attnkit.functional import nan_kernel
from attnkit.functional.checks import Dims

pytest.importorskip("triton", reason="the kernel is Triton's: the test extra installs it (pyproject.toml)")

_CASES = r"""
import itertools, math, random, sys
import torch
import triton.runtime.interpreter as interpreter

# Triton 3.6's interpreter hands a scalar argument over as a one-element array, which int() refuses under NumPy 2.4
# ("only 0-dimensional arrays can be converted"): a loop bound such as range(0, S, ROWS) needs it as an int
_patch_tensor = interpreter._patch_lang_tensor
def _with_index(tensor, scope):
    _patch_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
interpreter._patch_lang_tensor = _with_index

from attnkit.functional import nan, nan_kernel
from attnkit.functional.checks import Dims

random.seed(0)
torch.manual_seed(0)
failures, runs = [], 0
shapes = [(1, 4, 4, 16, 16, 32, 32), (2, 4, 2, 1, 37, 16, 16), (1, 6, 2, 70, 5, 8, 24), (2, 2, 1, 3, 0, 16, 16),
          (1, 3, 3, 130, 66, 64, 64), (1, 4, 1, 9, 129, 128, 128), (1, 2, 2, 5, 7, 33, 17)]
for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
    for B, H, Hkv, L, S, E, Ev in shapes:
        dims = Dims(B, H, Hkv, L, S, E, Ev)
        for where, layout in itertools.product(("none", "q", "k", "v", "qk"), ("bhle", "blhe")):
            q = torch.randn(B, H, L, E).to(dtype)
            k = torch.randn(B, Hkv, S, E).to(dtype)
            v = torch.randn(B, Hkv, S, Ev).to(dtype)
            for name in where if where != "none" else ():
                x = {"q": q, "k": k, "v": v}[name]
                if x.numel():
                    x.view(-1)[random.randrange(x.numel())] = math.nan
            out = torch.randn(B, H, L, Ev).to(dtype) if layout == "bhle" else \
                torch.randn(B, L, H, Ev).to(dtype).transpose(1, 2)
            poisoned = nan.poisoned_rows(q, k, v, dims)
            want = out.clone() if poisoned is None else torch.where(poisoned, math.nan, out)
            got = out.clone()
            nan_kernel.launch(q, k, v, dims, got)
            runs += 1
            if not torch.equal(torch.isnan(got), torch.isnan(want)) or not torch.equal(got.nan_to_num(), want.nan_to_num()):
                failures.append((str(dtype), dims, where, layout))
print("runs", runs)
print("failures", failures)
sys.exit(1 if failures else 0)
"""


@pytest.mark.slow
def test_kernel_poisons_the_same_rows_as_the_seven_kernels_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", _CASES], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "runs 280" in done.stdout, done.stdout


def test_kernel_stays_off_where_writing_in_place_would_not_be_the_rule():
    """On CUDA (tests/gpu) the kernel stands for the seven kernels only where writing in place is the rule's result;
    the conditions that need no GPU are asserted here, each on its own."""
    dims = Dims(1, 2, 2, 4, 4, 8, 8)
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    out = torch.randn(1, 2, 4, 8)
    assert not nan_kernel.applies(q, k, v, Dims(1, 2, 2, 4, 4, nan_kernel.MAX_HEAD_DIM + 1, 8), out)  # too wide
    assert not nan_kernel.applies(q, k, v, Dims(1, 2, 2, 0, 4, 8, 8), out[:, :, :0])  # no query rows
    long = Dims(1, 2, 2, 4, nan_kernel.PROGRAM_MAX_BYTES // (16 * 4) + 1, 8, 8)  # one program would read over 1 MiB
    assert not nan_kernel.applies(q, k, v, long, out)
    assert not nan_kernel.applies(q.transpose(2, 3), k, v, dims, out)  # a head not contiguous
    assert not nan_kernel.applies(q, k, v, dims, torch.randn(1, 2, 1, 8).expand(1, 2, 4, 8))  # aliased rows
    assert not nan_kernel.applies(q, k, v, dims, v[:, :, :, :])  # the output is the values' storage
    with torch.enable_grad():
        assert not nan_kernel.applies(q, k, v, dims, out.requires_grad_(True))  # where() gives such rows zero grad
    q[0, 0, 0, 0] = float("nan")  # refused: nothing launched, the output left for the seven kernels
    before = out.detach().clone()
    assert not nan_kernel.poisoned_in_place(q, k, v, Dims(1, 2, 2, 4, 4, nan_kernel.MAX_HEAD_DIM + 1, 8), out)
    assert torch.equal(out.detach(), before)


def test_kernel_only_for_nvidia_gpus_triton_compiles_for(monkeypatch):
    """Pascal and older (Triton's floor is compute capability 7.0) and ROCm builds keep the seven kernels."""
    check = nan_kernel._compiles_for.__wrapped__
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (6, 1))
    assert not check(0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    assert check(0)  # Triton importable here (the test module skips otherwise)
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert not check(0)
