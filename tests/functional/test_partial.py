"""Partial attention (attnkit.functional.partial): one part's (output, log-sum-exp) from the fused
kernel and from plain PyTorch equal float64 attention over that part; parts merged equal attention
over all the keys; the parts' gradients from the merged output add up to the whole's (float64
autograd through the reference backend)."""

from __future__ import annotations

import math

import pytest
import torch

import attnkit
from attnkit.functional import partial
from attnkit.functional.partial import merge_partial, partial_attention, partial_attention_backward

DTYPES = {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 3e-2}


@pytest.fixture(params=[True, False], ids=["fused", "plain"])
def kernel(request, monkeypatch):
    monkeypatch.setattr(partial, "FUSED", request.param)
    return request.param


def _case(seed: int, E: int = 16, Ev: int = 16, Lq: int = 37, S: int = 53):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 3, Lq, E, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, S, E, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, S, Ev, generator=g, dtype=torch.float64)
    allowed = torch.rand(Lq, S, generator=g) > 0.4
    allowed[5] = False  # a query with no key at all
    key_mask = torch.rand(2, S, generator=g) > 0.2
    return q, k, v, allowed[None, None] & key_mask[:, None, None, :]


def _bias(ok: torch.Tensor, dtype) -> torch.Tensor:
    return torch.zeros(ok.shape, dtype=dtype).masked_fill(~ok, float("-inf"))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads", [(16, 16), (16, 8), (8, 24)], ids=["E=Ev", "Ev<E", "Ev>E"])
def test_a_part_equals_float64_attention_with_empty_rows_zero_and_minus_inf(kernel, dtype, heads):
    q, k, v, ok = _case(0, *heads)
    out, lse = partial_attention(*(x.to(dtype) for x in (q, k, v)), 0.3, _bias(ok, dtype))
    want = attnkit.attention(q, k, v, mask=ok, scale=0.3, backend="reference").output
    scores = (q @ k.transpose(-1, -2) * 0.3).masked_fill(~ok, float("-inf"))
    tol = DTYPES[dtype]
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)
    finite = ok.any(-1).expand_as(lse)
    torch.testing.assert_close(lse.double()[finite], torch.logsumexp(scores, -1)[finite], rtol=tol, atol=tol)
    assert torch.isneginf(lse[~finite]).all() and (out[~finite] == 0).all()
    assert lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_causal_flag_is_the_top_left_triangle_with_or_without_a_bias(kernel, dtype):
    q, k, v, ok = _case(1, Lq=40, S=40)
    tol = DTYPES[dtype]
    tril = torch.ones(40, 40, dtype=torch.bool).tril()
    for bias_ok in (None, ok):
        bias = None if bias_ok is None else _bias(bias_ok, dtype)
        out, _ = partial_attention(*(x.to(dtype) for x in (q, k, v)), 0.25, bias, is_causal=True)
        mask = tril if bias_ok is None else bias_ok & tril
        want = attnkit.attention(q, k, v, mask=mask, scale=0.25, backend="reference").output
        torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_parts_merge_to_the_whole_and_their_gradients_add_up(kernel, dtype):
    q, k, v, ok = _case(2, Ev=12)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    want = attnkit.attention(q, k, v, mask=ok, scale=0.3, backend="reference").output
    d_out = torch.randn_like(want)
    grads = torch.autograd.grad(want, (q, k, v), d_out)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    out = torch.zeros(2, 3, 37, 12, dtype=acc)
    lse = torch.full((2, 3, 37), float("-inf"), dtype=acc)
    cuts = [(0, 20), (20, 21), (21, 53)]  # one part of a single key: most rows have no key there
    x = [t.detach().to(dtype) for t in (q, k, v)]
    for a, b in cuts:
        out, lse = merge_partial(out, lse, *partial_attention(x[0], x[1][:, :, a:b], x[2][:, :, a:b], 0.3,
                                                              _bias(ok[..., a:b], dtype)))
    tol = DTYPES[dtype]
    torch.testing.assert_close(out.double(), want.detach(), rtol=tol, atol=tol)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    dq = torch.zeros_like(q, dtype=torch.float64)
    dk, dv = [], []
    for a, b in cuts:
        gq, gk, gv = partial_attention_backward(d_out.to(dtype), x[0], x[1][:, :, a:b], x[2][:, :, a:b], out, safe,
                                                0.3, _bias(ok[..., a:b], dtype))
        dq += gq.double()
        dk.append(gk.double())
        dv.append(gv.double())
    tol = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 8e-2}[dtype]
    for name, got, w in zip("qkv", (dq, torch.cat(dk, 2), torch.cat(dv, 2)), grads):
        assert torch.isfinite(got).all(), name
        torch.testing.assert_close(got, w, rtol=tol, atol=tol, msg=lambda m, name=name: f"d{name}: {m}")


def test_the_fused_kernel_is_named_by_device_and_dtype(monkeypatch):
    assert partial.fused(torch.zeros(1, dtype=torch.float32)) == "cpu-flash"
    assert partial.fused(torch.zeros(1, dtype=torch.float64)) == "cpu-flash"
    assert partial.fused(torch.zeros(1, dtype=torch.int64)) is None
    monkeypatch.setattr(partial, "FUSED", False)
    assert partial.fused(torch.zeros(1)) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_bias_beyond_what_a_float32_lse_resolves_is_refused_by_name(dtype):
    # A row of -1e9 on every key: its float32 lse is -1e9 whatever the scores, so two parts would merge
    # half and half (output errors of order 1 before this check).
    q, k, v, _ = _case(3)
    bias = torch.full((1, 1, q.shape[2], k.shape[2]), -1e9, dtype=dtype)
    with pytest.raises(ValueError, match=r"bias: some row's largest finite entry is [0-9.]+e\+0[89] .*beyond the \+-64.* -inf"):
        partial_attention(*(x.to(dtype) for x in (q, k, v)), 0.3, bias)
    bias[..., 1:] = float("-inf")  # one finite key of -1e9 is as huge; 0 and -inf alone are fine
    with pytest.raises(ValueError, match="bias"):
        partial_attention(*(x.to(dtype) for x in (q, k, v)), 0.3, bias)
    partial_attention(*(x.to(dtype) for x in (q, k, v)), 0.3, torch.zeros_like(bias).masked_fill(torch.isinf(bias), -math.inf))


def test_float64_parts_with_a_huge_bias_merge_exactly(kernel):
    q, k, v, _ = _case(4)
    bias = torch.full((1, 1, q.shape[2], k.shape[2]), -1e9, dtype=torch.float64)
    out = torch.zeros(2, 3, q.shape[2], v.shape[-1], dtype=torch.float64)
    lse = torch.full(out.shape[:-1], float("-inf"), dtype=torch.float64)
    for a, b in [(0, 20), (20, k.shape[2])]:
        out, lse = merge_partial(out, lse, *partial_attention(q, k[:, :, a:b], v[:, :, a:b], 0.3, bias[..., a:b]))
    want = torch.softmax(q @ k.transpose(-1, -2) * 0.3, -1) @ v  # a constant bias changes nothing
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
