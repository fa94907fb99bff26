"""Edges of the functional core, each against the documented rule or another backend on the same inputs, in
float64:

- ``return_lse=True`` on ``auto`` with a bias that needs gradients picks a backend that gives both;
- a sink of -inf (a head without a sink) on a row with no allowed key: zeros and finite gradients in every
  backend, as SDPA and docs/semantics.md say;
- ``topk_attention`` where no query attends any key returns zeros on the autograd graph, either way of
  attending a block;
- values of width 0: the empty output on every backend, flex's CPU kernel included."""

from __future__ import annotations

import math

import pytest
import torch

import attnkit
from attnkit.functional import topk
from attnkit.functional.topk import topk_attention

from helpers import slow


def _qkv(rng, B=2, H=4, Hkv=2, L=5, S=7, E=16, Ev=16, grad=True):
    make = lambda *shape: torch.randn(*shape, generator=rng, dtype=torch.float64).requires_grad_(grad)  # noqa: E731
    return make(B, H, L, E), make(B, Hkv, S, E), make(B, Hkv, S, Ev)


def test_auto_with_return_lse_and_a_learned_bias_gives_the_lse_and_the_bias_gradient(rng):
    q, k, v = _qkv(rng)
    bias = torch.randn(1, 4, 5, 7, generator=rng, dtype=torch.float64, requires_grad=True)
    got = attnkit.attention(q, k, v, bias=bias, return_lse=True, backend="auto")
    got.output.sum().backward()
    got_grad, bias.grad = bias.grad, None
    want = attnkit.attention(q, k, v, bias=bias, return_lse=True, backend="reference")
    want.output.sum().backward()
    torch.testing.assert_close(got.lse, want.lse, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_grad, bias.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ["reference", "tiled", "auto", "sdpa", slow("flex")])
def test_a_head_without_a_sink_on_a_row_without_keys_gives_zeros_and_finite_gradients(backend, rng):
    grad = backend != "flex"  # FlexAttention has no CPU backward
    q, k, v = _qkv(rng, grad=grad)
    sinks = torch.tensor([-math.inf, 0.5, -math.inf, -1.0], dtype=torch.float64, requires_grad=grad)
    mask = torch.ones(5, 7, dtype=torch.bool)
    mask[2] = False  # row 2 attends nothing
    result = attnkit.attention(q, k, v, mask=mask, sinks=sinks, backend=backend)
    assert not torch.isnan(result.output).any()
    assert (result.output[:, :, 2] == 0).all()
    no_sink = attnkit.attention(q, k, v, mask=mask, backend="reference").output
    torch.testing.assert_close(result.output[:, [0, 2]], no_sink[:, [0, 2]], rtol=1e-12, atol=1e-12)
    if result.lse is not None:
        assert (result.lse[:, [0, 2], 2] == -math.inf).all() and (result.lse[:, 1, 2] == 0.5).all()
    if grad:
        result.output.sum().backward()
        grads = [q.grad, k.grad, v.grad, sinks.grad]
        assert all(torch.isfinite(g).all() for g in grads), backend
        for x in (q, k, v, sinks):
            x.grad = None
        attnkit.attention(q, k, v, mask=mask, sinks=sinks, backend="sdpa").output.sum().backward()
        for got, want in zip(grads, (q.grad, k.grad, v.grad, sinks.grad)):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("way", ["union", "each"])
def test_topk_attention_with_no_key_for_any_query_is_zeros_on_the_graph(way, rng, monkeypatch):
    monkeypatch.setattr(topk, "_union_limit", lambda slots, groups: math.inf if way == "union" else -1)
    q, k, v = _qkv(rng)
    indices = torch.full((2, 5, 3), -1)  # every slot empty
    out = topk_attention(q, k, v, indices)
    assert (out.output == 0).all() and (out.lse == -math.inf).all() and out.output.requires_grad
    out.output.sum().backward()
    assert all((x.grad == 0).all() for x in (q, k, v))


@pytest.mark.parametrize("backend", ["reference", "tiled", "auto", "sdpa", "flex"])
def test_values_of_width_zero_give_the_empty_output_on_every_backend(backend, rng):
    for dtype in (torch.float32, torch.float64):
        q, k, v = (x.detach().to(dtype) for x in _qkv(rng, Ev=0, grad=False))
        result = attnkit.attention(q, k, v, is_causal=True, backend=backend)
        assert result.output.shape == (2, 4, 5, 0) and result.output.dtype == dtype
