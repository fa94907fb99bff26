"""Learned attention sinks (``attention(sinks=...)``, gpt-oss): every backend against the float64
oracle over the masking grid, gradients (sinks included) against float64 autograd of the plain
formula, and the formula transformers' gpt-oss writes (a sink column in the softmax, dropped)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnkit
from attnkit import masks

from helpers import DTYPES, assert_close, numpy, randn, slow
from test_attention import BACKENDS, CASES, MASKINGS, make_call, oracle

# Half precision runs in the full tier only (the quick tier keeps float32 and float64).
SINK_DTYPES = [slow(d) if d in (torch.bfloat16, torch.float16) else d for d in DTYPES]


def _sinks(H: int, dtype, generator) -> torch.Tensor:
    return (2.0 * randn(H, dtype=torch.float64, generator=generator)).to(dtype)


@pytest.mark.parametrize("masking", MASKINGS)
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", SINK_DTYPES, ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
def test_sinks_match_the_float64_oracle(backend, dtype, case, masking, rng, small_tiles):
    q, k, v, kwargs = make_call(case, masking, dtype, rng)
    sinks = _sinks(q.shape[1], dtype, rng)
    result = attnkit.attention(q, k, v, backend=backend, need_weights=True, sinks=sinks, **kwargs)
    expected_out, expected_weights, expected_lse = oracle(q, k, v, kwargs | {"sinks": sinks})
    assert_close(result.output, expected_out, dtype, "output")
    assert_close(result.weights, expected_weights, dtype, "weights")
    # A sink makes every row's weights sum to less than one, fully masked rows to zero.
    assert (numpy(result.weights).sum(-1) < 1 + (1e-2 if dtype != torch.float64 else 1e-9)).all()
    if result.lse is not None:
        assert np.isfinite(numpy(result.lse)).all(), "with a finite sink no row's lse is -inf"
        assert np.allclose(numpy(result.lse), expected_lse, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("masking", ["none", "causal-bottom-right", "window-top-left", "padding", "bias+padding"])
def test_sink_gradients_equal_float64_autograd(backend, masking, rng, small_tiles):
    q, k, v, kwargs = make_call("gqa-33x97", masking, torch.float64, rng)
    sinks = _sinks(q.shape[1], torch.float64, rng)
    d_out = randn(*q.shape[:3], v.shape[-1], dtype=torch.float64, generator=rng)

    def grads(backend_name):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, sinks)]
        out = attnkit.attention(*leaves[:3], backend=backend_name, sinks=leaves[3], **kwargs).output
        return torch.autograd.grad(out, leaves, d_out)

    expected = _plain_grads(q, k, v, sinks, kwargs, d_out)
    for got, want, name in zip(grads(backend), expected, "qkv" + "s"):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=name)


def _plain_grads(q, k, v, sinks, kwargs, d_out):
    """Float64 autograd of gpt-oss's eager formula: softmax over [scores, sink], drop the sink."""
    leaves = [x.clone().requires_grad_() for x in (q, k, v, sinks)]
    ql, kl, vl, sl = leaves
    B, H, L, E = ql.shape
    groups = H // kl.shape[1]
    kr, vr = kl.repeat_interleave(groups, 1), vl.repeat_interleave(groups, 1)
    scores = ql @ kr.transpose(-1, -2) / E**0.5
    S = kr.shape[2]
    allowed = torch.ones(B, H, L, S, dtype=torch.bool)
    if "mask" in kwargs:
        allowed &= kwargs["mask"]
    if "bias" in kwargs:
        scores = scores + kwargs["bias"]
    align = kwargs.get("causal_align", "top-left")
    if kwargs.get("window") is not None:
        allowed &= masks.sliding_window(L, S, kwargs["window"], causal_align=align)
    elif kwargs.get("is_causal"):
        allowed &= masks.causal(L, S, causal_align=align)
    scores = scores.masked_fill(~allowed, float("-inf"))
    combined = torch.cat([scores, sl.view(1, H, 1, 1).expand(B, H, L, 1)], dim=-1)
    probs = torch.softmax(combined, dim=-1)[..., :-1]
    out = probs @ vr
    return torch.autograd.grad(out, leaves, d_out)


def test_gpt_oss_formula_and_the_meaning_of_a_sink(rng):
    """A very negative sink is no sink; a sink that dominates takes the weight from every key."""
    q, k, v, _ = make_call("mha-97-e59", "none", torch.float64, rng)
    H = q.shape[1]
    plain = attnkit.attention(q, k, v, is_causal=True)
    faint = attnkit.attention(q, k, v, is_causal=True, sinks=torch.full((H,), -1e4, dtype=torch.float64))
    torch.testing.assert_close(faint.output, plain.output, rtol=0, atol=1e-12)
    strong = attnkit.attention(q, k, v, is_causal=True, sinks=torch.full((H,), 1e4, dtype=torch.float64),
                               need_weights=True)
    assert strong.output.abs().max() < 1e-12 and strong.weights.abs().max() < 1e-12


@pytest.mark.parametrize("sinks, error, words", [
    (torch.zeros(3), ValueError, "sinks must have shape (H,) = (4,)"),
    (torch.zeros(4, dtype=torch.long), TypeError, "floating"),
    ([0.0] * 4, TypeError, "sinks must be a tensor"),
])
def test_bad_sinks_are_rejected_by_name(sinks, error, words):
    q = torch.randn(1, 4, 5, 8)
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        attnkit.attention(q, q, q, sinks=sinks)


def test_auto_takes_sdpa_for_small_calls_with_sinks_and_tiled_above(rng):
    """Up to AUTO_SINKS_SDPA_MAX_ENTRIES scores the sink is one more key for SDPA (measured faster);
    above, the tiled loop carries it in its lse without materialising a mask."""
    from attnkit.functional.backends.common import Problem
    from attnkit.functional.checks import Dims
    from attnkit.functional.routing import AUTO_SINKS_SDPA_MAX_ENTRIES, choose_backend

    small = Problem(dims=Dims(1, 4, 4, 8, 8, 8, 8), scale=1.0, sinks=torch.zeros(4))
    assert choose_backend(small) == "sdpa"
    n = int(AUTO_SINKS_SDPA_MAX_ENTRIES**0.5) + 1
    large = Problem(dims=Dims(1, 4, 4, n, n, 8, 8), scale=1.0, sinks=torch.zeros(4))
    assert choose_backend(large) == "tiled"
