"""Shared test helpers: seeded inputs, the float64 oracle on torch tensors, tolerances by dtype."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from attnkit.functional.backends import tiled

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One thread per xdist worker: two workers with two threads each would oversubscribe 2 cores.
    torch.set_num_threads(1)

# Tolerances against the float64 oracle, by input dtype: (rtol, atol).
TOLERANCES = {
    torch.float64: (1e-9, 1e-10),
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}
DTYPES = list(TOLERANCES)


def numpy(x: torch.Tensor | None):
    """A tensor as a NumPy array: boolean stays boolean, everything else becomes float64."""
    if x is None:
        return None
    if x.dtype == torch.bool:
        return x.detach().cpu().numpy()
    return x.detach().to(torch.float64).cpu().numpy()


def assert_close(actual: torch.Tensor, expected, dtype: torch.dtype, what: str = "") -> None:
    """|actual - expected| <= atol + rtol |expected| elementwise, expected a float64 array."""
    rtol, atol = TOLERANCES[dtype]
    got = numpy(actual)
    expected = np.asarray(expected, dtype=np.float64)
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    assert not np.isnan(got).any(), f"{what}: NaN in result"
    error = np.abs(got - expected)
    bound = atol + rtol * np.abs(expected)
    worst = np.unravel_index(np.argmax(error - bound), error.shape)
    assert (error <= bound).all(), (
        f"{what}: max error {error.max():.3g} at {worst}: got {got[worst]!r}, expected {expected[worst]!r} "
        f"(rtol={rtol}, atol={atol})"
    )


def randn(*shape, dtype=torch.float32, generator=None, requires_grad=False):
    x = torch.randn(*shape, dtype=torch.float64, generator=generator).to(dtype)
    return x.requires_grad_(requires_grad)


@pytest.fixture
def rng():
    """A fresh, seeded generator per test: fresh random inputs, reproducible failures."""
    return torch.Generator().manual_seed(20261121)


@pytest.fixture
def small_tiles(monkeypatch):
    """Make the tiled backend use many small blocks so that block edges are exercised."""
    monkeypatch.setattr(tiled, "BLOCK_Q", 16)
    monkeypatch.setattr(tiled, "MIN_BLOCK_K", 8)
    monkeypatch.setattr(tiled, "SCORE_BLOCK_ELEMENTS", 16 * 24)
