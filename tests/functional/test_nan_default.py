"""What a NaN does by default (the NaN rule off), per backend on the CPU: docs/semantics.md's table, held here so
that the page says what the kernels do. With the rule on every backend gives the rule's rows (test_sweep.py,
test_per_call.py, test_attention_edges.py)."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit.functional.backends import flex

KNOWN_CPU = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def _nan_query(S: int, backend: str) -> bool:
    """Whether a NaN in query row 2 of head 1 makes that row NaN."""
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, S, 8), torch.randn(1, 2, S, 8)
    q[0, 1, 2, 0] = float("nan")
    out = attnkit.attention(q, k, v, backend=backend).output
    assert not out[0, 0].isnan().any() and not out[0, 1, [0, 1, 3]].isnan().any()
    return bool(out[0, 1, 2].isnan().all())


def _nan_at_a_masked_key(backend: str) -> bool:
    """Whether a NaN in a key no query may attend makes its head's rows NaN."""
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    k[0, 1, 8, 0] = float("nan")
    allowed = torch.ones(4, 9, dtype=torch.bool)
    allowed[:, 8] = False
    out = attnkit.attention(q, k, v, mask=allowed, backend=backend).output
    assert not out[0, 0].isnan().any()
    return bool(out[0, 1].isnan().all())


def _nan_in_bias(backend: str) -> bool:
    """Whether a NaN in the bias at an allowed key makes its row NaN."""
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    bias = torch.zeros(4, 9)
    bias[1, 3] = float("nan")
    out = attnkit.attention(q, k, v, bias=bias, backend=backend).output
    assert not out[:, :, [0, 2, 3]].isnan().any()
    return bool(out[0, :, 1].isnan().all())


# backend: (NaN query under a vector's width of keys, from there, NaN at a masked key, NaN in bias)
TABLE = {
    "reference": (True, True, False, True),
    "tiled": (True, True, False, True),
    "sdpa": (False, True, True, True),
    "flex, eager": (True, True, False, True),  # flex's eager path (float64 on the CPU)
    "flex": (False, False, False, False),  # its compiled kernel (CUDA; the CPU forward in float32 and half types)
}


@pytest.mark.parametrize("backend", [pytest.param(name, marks=pytest.mark.slow) if name == "flex" else name
                                     for name in TABLE])  # (compiling flex for four shapes takes seconds)
def test_each_backend_does_what_the_semantics_page_says(backend, monkeypatch):
    if backend == "flex, eager":
        monkeypatch.setattr(flex, "COMPILE_ON_CPU", False)
    assert not attnkit.functional.nan.on()
    short, long, masked_key, bias = TABLE[backend]
    backend = backend.split(",")[0]
    torch.manual_seed(0)
    if KNOWN_CPU or backend != "sdpa":  # (SDPA's vector width is known on x86's AVX2 and AVX-512)
        assert _nan_query(3, backend) is short
    assert _nan_query(40, backend) is long
    assert _nan_at_a_masked_key(backend) is masked_key
    assert _nan_in_bias(backend) is bias


def test_a_row_with_no_allowed_key_gives_zeros():
    """That is the mask's meaning, kept with the rule off: zeros in every backend; with a NaN in that row's query,
    zeros in all but SDPA's CPU kernel, where the masked scores are NaN + -inf."""
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    allowed = torch.ones(4, 9, dtype=torch.bool)
    allowed[2] = False
    for backend in ("reference", "sdpa", "tiled", "auto"):
        out = attnkit.attention(q, k, v, mask=allowed, backend=backend).output
        assert (out[:, :, 2] == 0).all(), backend
    q[0, 1, 2, 0] = float("nan")
    for backend in ("reference", "tiled"):
        assert (attnkit.attention(q, k, v, mask=allowed, backend=backend).output[:, :, 2] == 0).all(), backend
    assert attnkit.attention(q, k, v, mask=allowed, backend="sdpa").output[0, 1, 2].isnan().all()
