"""Rows with no allowed key, additive masks, NaN in a bias, the order of bias, score_mod and masking,
and a scale that overflows: every backend gives the float64 oracle's numbers or the same named error.

"No allowed key" for an additive mask: a bias entry of -inf or at most finfo(dtype).min / 2 (what
transformers' and x-transformers' masks hold) is a masked key, as ``masks.from_additive`` reads it;
a row of them gets zero weights, a zero output, lse -inf and zero gradients.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import attnkit
from attnkit import masks, reference
from attnkit.functional.backends import flex

from helpers import DTYPES, assert_close, numpy, randn, slow

BACKENDS = ["reference", "sdpa", "tiled", slow("flex"), "auto"]


@pytest.fixture
def eager_flex(monkeypatch):
    """flex through its eager implementation: the semantics, with nothing compiled."""
    monkeypatch.setattr(flex, "COMPILE_ON_CPU", False)


def _inputs(dtype, generator, B=2, H=4, Hkv=2, L=9, S=11, E=16):
    return (randn(B, H, L, E, dtype=dtype, generator=generator), randn(B, Hkv, S, E, dtype=dtype, generator=generator),
            randn(B, Hkv, S, E, dtype=dtype, generator=generator))


def _oracle(q, k, v, **kwargs):
    converted = {name: numpy(x) if isinstance(x, torch.Tensor) else x for name, x in kwargs.items()}
    return reference.attention(numpy(q), numpy(k), numpy(v), masked_at=torch.finfo(q.dtype).min / 2, **converted)


def _additive_mask(dtype, generator, B=2, L=9, S=11):
    """finfo.min where masked (transformers' convention), a few -inf, a whole row at finfo.min in the
    first example and a whole row mixing -inf and finfo.min in the second."""
    low = torch.finfo(dtype).min
    bias = torch.zeros(B, 1, L, S, dtype=dtype).masked_fill(torch.rand(B, 1, L, S, generator=generator) < 0.3, low)
    bias[:, :, 1, 2] = float("-inf")
    bias[0, :, 4] = low
    bias[1, :, 6] = low
    bias[1, :, 6, ::2] = float("-inf")
    return bias


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_masked_with_finfo_min_have_no_allowed_key(backend, dtype, rng, eager_flex):
    q, k, v = _inputs(dtype, rng)
    bias = _additive_mask(dtype, rng)
    result = attnkit.attention(q, k, v, bias=bias, backend=backend, need_weights=True)
    out, weights, lse = _oracle(q, k, v, bias=bias)
    assert_close(result.output, out, dtype, "output")
    assert_close(result.weights, weights, dtype, "weights")
    for b, row in ((0, 4), (1, 6)):  # the oracle says zero too; state it plainly
        assert (result.output[b, :, row] == 0).all() and (result.weights[b, :, row] == 0).all()
    if result.lse is not None:
        assert torch.isneginf(result.lse[0, :, 4]).all()
        finite = np.isfinite(lse)
        assert np.allclose(numpy(result.lse)[finite], lse[finite], rtol=1e-2 if dtype == torch.bfloat16 else 1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_weights_of_huge_negative_bias_rows_are_exact(backend, rng, eager_flex):
    """A bias of -1e30 everywhere is a bias, not a mask: the weights are softmax(scores), summing to
    one (an lse of -1e30 + log S would have given 1.0 for every key)."""
    q, k, v = _inputs(torch.float32, rng)
    bias = torch.full((9, 11), -1e30)
    result = attnkit.attention(q, k, v, bias=bias, backend=backend, need_weights=True)
    out, weights, _ = _oracle(q, k, v, bias=bias)
    assert_close(result.weights, weights, torch.float32, "weights")
    assert torch.allclose(result.weights.sum(-1), torch.ones(()), atol=1e-5)


@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("backend", ["reference", "sdpa", "tiled", "auto"])
def test_gradients_of_rows_with_no_allowed_key_are_zero(backend, with_sinks, rng):
    """Rows masked by -inf bias, finfo.min bias or False: zero gradients to their queries, finite
    everywhere, and q, k, v gradients equal to float64 autograd of the reference."""
    q, k, v = _inputs(torch.float64, rng)
    bias = torch.zeros(9, 11, dtype=torch.float64)
    bias[2] = float("-inf")
    bias[5] = torch.finfo(torch.float64).min
    mask = torch.ones(9, 11, dtype=torch.bool)
    mask[7] = False
    sinks = randn(4, dtype=torch.float64, generator=rng) if with_sinks else None
    grads = []
    with_lse = None  # the lse joins the loss where the backend under test returns it
    for name in (backend, "reference"):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        result = attnkit.attention(*leaves, bias=bias, mask=mask, sinks=sinks, backend=name)
        loss = (result.output * torch.linspace(-1, 1, 16, dtype=torch.float64)).sum()
        with_lse = result.lse is not None if with_lse is None else with_lse
        if with_lse:
            loss = loss + result.lse.masked_fill(torch.isinf(result.lse), 0).sum()
        loss.backward()
        grads.append([x.grad for x in leaves])
    for got, want in zip(*grads):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)
    assert (grads[0][0][:, :, [2, 5, 7]] == 0).all()


@pytest.mark.parametrize("where", ["allowed", "causal", "mask", "finfo-min"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_in_bias_poisons_its_row_only_at_an_allowed_key(backend, where, rng, eager_flex):
    B, H, L, S = 2, 4, 130, 300  # flex's kernel tiles are 128: the NaN sits in a second row of tiles
    q, k, v = _inputs(torch.float32, rng, B=B, H=H, L=L, S=S)
    bias = torch.zeros(B, 1, L, S)
    kwargs: dict = {"is_causal": True} if where == "causal" else {}
    if where == "mask":
        mask = torch.ones(L, S, dtype=torch.bool)
        mask[129, 7] = False
        kwargs["mask"] = mask
    if where == "finfo-min":
        bias[1, 0, 129, 8] = torch.finfo(torch.float32).min
    key = {"allowed": 3, "causal": 250, "mask": 7, "finfo-min": 9}[where]
    bias[1, 0, 129, key] = math.nan
    if where == "finfo-min":  # a NaN in a row otherwise all masked: the NaN is allowed, so NaN
        bias[1, 0, 129] = torch.finfo(torch.float32).min
        bias[1, 0, 129, key] = math.nan
    output = attnkit.attention(q, k, v, bias=bias, backend=backend, **kwargs).output
    poisoned = torch.isnan(output).any(dim=-1)
    expected = torch.zeros(B, H, L, dtype=torch.bool)
    if where in ("allowed", "finfo-min"):
        expected[1, :, 129] = True
    assert torch.equal(poisoned, expected)


@pytest.mark.parametrize("backend", ["reference", "tiled", slow("flex"), "auto"])
def test_a_masked_bias_stays_masked_whatever_the_score_mod(backend, rng, eager_flex):
    """Order: scaled scores + bias, then score_mod, then masking; a bias of -inf (or finfo.min) is
    masking, so softcapping cannot bring such a key back (30 tanh(-inf) would be -30)."""
    q, k, v = _inputs(torch.float32, rng)
    bias = torch.zeros(9, 11)
    bias[3] = float("-inf")
    bias[4, :5] = torch.finfo(torch.float32).min

    def softcap(score, b, h, q_idx, kv_idx):
        return 30 * torch.tanh(score / 30)

    result = attnkit.attention(q, k, v, bias=bias, score_mod=softcap, backend=backend, need_weights=True)
    out, weights, _ = _oracle(q, k, v, bias=bias, score_mod=lambda s, b, h, i, keys: 30 * np.tanh(s / 30))
    assert_close(result.output, out, torch.float32, "output")
    assert_close(result.weights, weights, torch.float32, "weights")
    assert (result.output[:, :, 3] == 0).all() and (result.weights[:, :, 4, :5] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_scale_that_overflows_the_dtype_is_refused(backend, dtype):
    q = torch.randn(1, 2, 4, 8, dtype=dtype)
    scale = 2 * torch.finfo(dtype).max / 8
    with pytest.raises(ValueError, match=r"scale=.* overflows .*scale x E"):
        attnkit.attention(q, q, q, scale=scale, is_causal=True, backend=backend)
    attnkit.attention(q, q, q, scale=torch.finfo(dtype).max / 8 / 2, backend=backend)  # the bound itself is fine


def test_from_additive_and_the_bias_rule_agree(rng):
    """The bias rule and masks.from_additive read an additive mask alike: the same numbers."""
    q, k, v = _inputs(torch.float32, rng)
    additive = _additive_mask(torch.float32, rng)
    via_bias = attnkit.attention(q, k, v, bias=additive).output
    via_mask = attnkit.attention(q, k, v, mask=masks.from_additive(additive)).output
    torch.testing.assert_close(via_bias, via_mask, rtol=0, atol=0)


@pytest.mark.parametrize("make", [lambda s: -s, lambda s: __import__("numpy").float64(s), lambda s: int(s)],
                         ids=["negative", "numpy float64", "int"])
def test_an_overflowing_scale_is_refused_whatever_its_sign_or_type(make):
    """A plain float within bounds is taken in a few comparisons; any other overflowing scale still meets the
    check that names it (and with E = 0 a scale is held to the dtype's largest value, as before)."""
    q = torch.randn(1, 2, 4, 8, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"scale=.* overflows .*scale x E"):
        attnkit.attention(q, q, q, scale=make(2 * torch.finfo(torch.float16).max / 8))
    empty = torch.randn(1, 2, 4, 0, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"scale=.* overflows"):
        attnkit.attention(empty, empty, empty, scale=make(2 * torch.finfo(torch.float16).max))
    out = attnkit.attention(q, q, q, scale=make(0.25)).output  # (-0.25, 0.25 and 0)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, q, q, scale=float(make(0.25))))
