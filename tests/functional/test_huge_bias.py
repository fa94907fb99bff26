"""Rows whose scores are all huge: a bias of -1e4 ... finfo.min / 4 (the ``masked_fill(~allowed, -1e9)``
convention), differentiated in every backend as autograd differentiates the plain softmax.

The forward of such a row is what the plain softmax gives in the compute dtype (a row of -1e9 in float32
rounds to one value: uniform weights). Fused kernels keep m + log l as one float32 number for their
backward; where m is huge that sum rounds to m and every p of the row became 1, not 1/S (dq exactly S
times autograd's). The oracle here is torch's own softmax and matmuls in float32 (the backends' compute
dtype), differentiated by autograd, with the lse's gradient taken as the softmax itself (d lse / d s = p).
"""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.functional.backends import common

from helpers import randn

BACKENDS = ["reference", "sdpa", "tiled", "auto"]
LSE_BACKENDS = ["reference", "tiled"]  # the backends that return the lse


def _values(dtype: torch.dtype) -> list[float]:
    """-1e4, -1e6, -1e9 and finfo.min / 4 where the dtype holds them (float16 turns -1e6 and -1e9 into
    -inf, a masked key: tested as such below)."""
    values = [-1e4, -1e6, -1e9, torch.finfo(dtype).min / 4]
    return [x for x in values if x > torch.finfo(dtype).min]


CASES = [(dtype, value) for dtype in (torch.float32, torch.bfloat16, torch.float16) for value in _values(dtype)]
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _inputs(dtype, value, generator, *, H=4, Hkv=2, L=6, S=9, E=16):
    q = randn(2, H, L, E, dtype=dtype, generator=generator)
    k, v = (randn(2, Hkv, S, E, dtype=dtype, generator=generator) for _ in range(2))
    bias = torch.zeros(2, 1, L, S, dtype=dtype)
    bias[0, :, 1] = value  # a whole row of huge scores
    bias[1, :, 3, :5] = value  # a row with some keys huge, some not
    bias[1, :, 4] = value  # another whole row
    bias[1, :, 4, 2] = value / 2  # one key less huge: the row is still all huge
    return q, k, v, bias


def _oracle(q, k, v, bias, mask, d_out, d_lse):
    """Plain softmax in float32 from the same inputs, autograd's gradients (q, k, v)."""
    q32, k32, v32 = (x.detach().float().requires_grad_() for x in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    k_r, v_r = k32.repeat_interleave(groups, 1), v32.repeat_interleave(groups, 1)
    scores = q32 @ k_r.transpose(-1, -2) / q.shape[-1] ** 0.5 + bias.float()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    p = torch.softmax(scores, dim=-1)
    out = p @ v_r
    lse_surrogate = (p.detach() * scores.masked_fill(~torch.isfinite(scores), 0)).sum(-1)  # gradient p, as lse's
    loss = (out * d_out.float()).sum() + (lse_surrogate * d_lse).sum()
    loss.backward()
    lse = torch.logsumexp(scores, dim=-1)
    return out, lse, p, (q32.grad, k32.grad, v32.grad)


def _close(got, want, dtype, what):
    scale = want.abs().max().clamp_min(1e-6)
    error = (got.float() - want).abs().max() / scale
    assert error <= TOLERANCE[dtype], f"{what}: max error {error:.3g} of the largest entry ({scale:.3g})"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("dtype", "value"), CASES, ids=[f"{d}-{v:.3g}".replace("torch.", "") for d, v in CASES])
def test_rows_of_huge_scores_get_autograds_gradients(dtype, value, backend, causal, rng):
    q, k, v, bias = _inputs(dtype, value, rng)
    L, S = q.shape[2], k.shape[2]
    mask = masks.causal(L, S, causal_align="bottom-right") if causal else None
    d_out = randn(*q.shape, dtype=dtype, generator=rng)
    with_lse = backend in LSE_BACKENDS
    d_lse = randn(*q.shape[:3], generator=rng) if with_lse else torch.zeros(q.shape[:3])
    want_out, want_lse, want_p, want_grads = _oracle(q, k, v, bias, mask, d_out, d_lse)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    result = attnkit.attention(*leaves, bias=bias, mask=mask, backend=backend, need_weights=True)
    loss = (result.output.float() * d_out.float()).sum()
    if with_lse:
        assert result.lse is not None
        _close(result.lse, want_lse, dtype, "lse")
        loss = loss + (result.lse.float() * d_lse).sum()
    loss.backward()
    _close(result.output, want_out, dtype, "output")
    _close(result.weights, want_p, dtype, "weights")
    for name, leaf, want in zip("qkv", leaves, want_grads):
        _close(leaf.grad, want, dtype, f"d{name}")


def test_a_row_of_minus_1e9_is_uniform_and_its_dq_is_not_S_times_too_large(rng):
    """The finding itself: float32, every key -1e9, sdpa and tiled gave dq = S x autograd's."""
    S = 7
    q, k, v = (randn(1, 1, 1 if i == 0 else S, 8, generator=rng, requires_grad=True) for i in range(3))
    bias = torch.full((1, 1, 1, S), -1e9)
    for backend in BACKENDS:
        out = attnkit.attention(q, k, v, bias=bias, backend=backend).output
        torch.testing.assert_close(out, v.mean(dim=2, keepdim=True), rtol=1e-6, atol=1e-6)
        (dq,) = torch.autograd.grad(out.sum(), q)
        # uniform p: dS_j = (dP_j - D) / S, dq = scale sum_j dS_j k_j
        d_p = v.sum(-1)[0, 0]  # (S,): dO = 1, so dP_j = sum(v_j)
        d_s = (d_p - d_p.mean()) / S
        want = (d_s[:, None] * k[0, 0]).sum(0) / 8 ** 0.5
        torch.testing.assert_close(dq[0, 0, 0], want.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["sdpa", "auto"])
def test_only_calls_that_need_it_leave_the_fused_kernel(backend, monkeypatch, rng):
    """The exact path runs only under autograd and with a row beyond the bound: a bias within it (ALiBi's
    rows peak at 0 whatever their slope), a row beyond it only at masked keys, or no gradient at all,
    stays on SDPA."""
    from attnkit.functional.backends import reference

    ran = []
    original = reference.forward
    monkeypatch.setattr(reference, "forward", lambda *a: ran.append(1) or original(*a))
    q, k, v = (randn(1, 2, 5, 8, generator=rng, requires_grad=True) for _ in range(3))
    ramp = -torch.arange(5.0).expand(5, 5) * 1e3  # each row's largest entry is 0
    huge = torch.zeros(5, 5)
    huge[2] = -1e9
    with torch.no_grad():
        attnkit.attention(q, k, v, bias=huge, backend=backend)
    attnkit.attention(q, k, v, bias=ramp, backend=backend).output.sum().backward()
    beyond_at_masked = huge.clone()
    beyond_at_masked[2, 0] = 0.0
    mask = torch.ones(5, 5, dtype=torch.bool)
    mask[2, 1:] = False
    attnkit.attention(q, k, v, bias=beyond_at_masked, mask=mask, backend=backend).output.sum().backward()
    assert ran == []
    attnkit.attention(q, k, v, bias=huge, backend=backend).output.sum().backward()
    assert ran == [1]
    assert common.LSE_RESOLVED_BOUND == 64.0


def test_in_float16_minus_1e6_is_minus_inf_a_masked_key(rng):
    """float16 cannot hold -1e6: the bias becomes -inf, a masked key; a row of them has no key (zeros)."""
    q, k, v = (randn(1, 1, 2, 8, dtype=torch.float16, generator=rng) for _ in range(3))
    bias = torch.tensor([[0.0, 0.0], [-1e6, -1e6]]).to(torch.float16)
    assert torch.isneginf(bias[1]).all()
    for backend in BACKENDS:
        out = attnkit.attention(q, k, v, bias=bias, backend=backend).output
        assert (out[0, 0, 1] == 0).all() and out[0, 0, 0].abs().sum() > 0
