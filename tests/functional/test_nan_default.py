"""What a NaN does by default (the NaN rule off), per backend on the CPU: docs/semantics.md's table, held here so
that the page says what the kernels do. With the rule on every backend gives the rule's rows (test_sweep.py,
test_per_call.py, test_attention_edges.py)."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit.functional.backends import flex


def _where_nan(x: torch.Tensor | None, keys: bool = False) -> str | None:
    """Where a (1, 2, n, E) tensor (an output or a gradient) is NaN, in the table's words: "-" nowhere, "row" in row
    2 of head 1 alone (the poisoned query), "row 1" in row 1 of both heads alone (the bias's NaN), "head" in every
    row of head 1 and nowhere in head 0; for dk and dv (``keys``) "head" is some NaN in head 1 alone, "heads" in
    both. None where no gradient was computed."""
    if x is None:
        return None
    rows = x[0].isnan().any(-1)  # (2, n)
    if not rows.any():
        return "-"
    if keys:
        return "heads" if rows.any(-1).all() else ("head" if rows[1].any() else "?")
    if rows[1].all() and not rows[0].any():
        return "head"
    if rows.nonzero().tolist() == [[1, 2]]:
        return "row"
    if rows.nonzero().tolist() == [[0, 1], [1, 1]]:
        return "row 1"
    return "?"


def _probe(backend: str, case: str, S: int, dtype: torch.dtype) -> tuple[str | None, ...]:
    """Where one NaN makes the output and, under autograd (a loss that drops the NaN entries), dq, dk and dv NaN:
    ``case`` "q" (query row 2 of head 1), "k" or "v" (the last key of head 1, which the mask rules out), "bias"
    (row 1 at an allowed key)."""
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 4, 8, dtype=dtype), torch.randn(1, 2, S, 8, dtype=dtype), torch.randn(1, 2, S, 8, dtype=dtype)
    mask = bias = None
    if case == "q":
        q[0, 1, 2, 0] = float("nan")
    elif case in ("k", "v"):
        mask = torch.ones(4, S, dtype=torch.bool)
        mask[:, -1] = False
        (k if case == "k" else v)[0, 1, -1, 0] = float("nan")
    else:
        bias = torch.zeros(4, S, dtype=dtype)
        bias[1, 3] = float("nan")
    grads = backend != "flex"  # (flex computes no gradients on the CPU)
    for x in (q, k, v):
        x.requires_grad_(grads)
    out = attnkit.attention(q, k, v, mask=mask, bias=bias, backend=backend).output
    if grads:
        torch.where(out.isnan(), 0.0, out).sum().backward()
    return (_where_nan(out.detach()), _where_nan(q.grad), _where_nan(k.grad, keys=True),
            _where_nan(v.grad, keys=True))


# backend: case: where the output, dq, dk and dv are NaN (None: no gradient); docs/semantics.md's table
TABLE = {
    "reference": {"q": ("row", "-", "head", "head"), "k": ("-", "head", "-", "-"),
                  "v": ("head", "head", "head", "-"), "bias": ("row 1", "row 1", "heads", "heads")},
    "tiled": {"q": ("row", "row", "head", "head"), "k": ("-", "head", "-", "-"),
              "v": ("head", "head", "head", "-"), "bias": ("row 1", "row 1", "heads", "heads")},
    "sdpa": {"q": ("row", "row", "head", "head"), "k": ("head", "head", "head", "head"),
             "v": ("head", "head", "head", "-"), "bias": ("row 1", "row 1", "heads", "heads")},
    "flex, eager": {"q": ("row", None, None, None), "k": ("-", None, None, None),  # float64 on the CPU
                    "v": ("head", None, None, None), "bias": ("row 1", None, None, None)},
    "flex": {"q": ("-", None, None, None), "k": ("-", None, None, None),  # compiled (CUDA; the CPU in float32)
             "v": ("head", None, None, None), "bias": ("-", None, None, None)},
}


@pytest.mark.parametrize("case", ["q", "k", "v", "bias"])
@pytest.mark.parametrize("backend", [pytest.param(name, marks=pytest.mark.slow) if name == "flex" else name
                                     for name in TABLE])  # (compiling flex for four shapes takes seconds)
def test_each_backend_does_what_the_semantics_page_says(backend, case, monkeypatch):
    if backend == "flex, eager":
        monkeypatch.setattr(flex, "COMPILE_ON_CPU", False)
    assert not attnkit.functional.nan.on()
    name = backend.split(",")[0]
    dtype = torch.float32 if backend == "flex" else torch.float64
    assert _probe(name, case, 40, dtype) == TABLE[backend][case]


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"),
                    reason="SDPA's vector width is known on x86's AVX2 and AVX-512 only")
def test_sdpa_drops_a_nan_query_under_a_vectors_width_of_keys_but_not_from_its_gradients():
    """With 3 keys SDPA's CPU kernel gives the NaN query row a finite output, and its backward still NaN."""
    assert _probe("sdpa", "q", 3, torch.float64) == ("-", "row", "head", "head")


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
