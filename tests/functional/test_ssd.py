"""Mamba-2's state-space layer on the linear core (``attnkit.functional.linear.ssd``) against an independent float64
recurrence written here in NumPy (1e-10), and against transformers' own torch forms of it, ``mamba2_chunk_scan``
(the chunked scan its Mamba-2 runs without the CUDA kernels) and ``mamba2_selective_state_update`` (one decoding
step), in float32 to their rounding."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnkit.functional.linear import implicit_attention, ssd, ssd_decays


def _inputs(rng, B=2, H=4, G=2, L=45, P=6, N=8, dtype=torch.float64):
    def randn(*shape):
        return torch.randn(*shape, generator=rng, dtype=torch.float64).to(dtype)

    x, dt = randn(B, H, L, P), randn(B, H, L)
    A = -torch.rand(H, generator=rng, dtype=torch.float64).to(dtype) * 2 - 0.1
    Bm, Cm = randn(B, G, L, N), randn(B, G, L, N)
    return x, dt, A, Bm, Cm, randn(H), randn(H)


def _oracle(x, dt, A, Bm, Cm, D, dt_bias, state=None, dt_limit=(0.0, math.inf)):
    """The recurrence of the paper, one head and token at a time, in float64 NumPy (state (N, P))."""
    x, dt, A, Bm, Cm, D, dt_bias = (t.double().numpy() for t in (x, dt, A, Bm, Cm, D, dt_bias))
    Bsz, H, L, P = x.shape
    G, N = Bm.shape[1], Bm.shape[3]
    y = np.zeros_like(x)
    final = np.zeros((Bsz, H, N, P))
    for b in range(Bsz):
        for h in range(H):
            S = np.zeros((N, P)) if state is None else state[b, h].double().numpy().copy()
            for t in range(L):
                step = np.clip(np.log1p(np.exp(dt[b, h, t] + dt_bias[h])), *dt_limit)
                g = h // (H // G)
                S = np.exp(step * A[h]) * S + np.outer(Bm[b, g, t], step * x[b, h, t])
                y[b, h, t] = S.T @ Cm[b, g, t] + D[h] * x[b, h, t]
            final[b, h] = S
    return y, final


@pytest.mark.parametrize("chunk_size", [1, 4, 16, 64])
def test_every_form_equals_the_float64_recurrence(chunk_size, rng):
    x, dt, A, Bm, Cm, D, dt_bias = _inputs(rng)
    state = torch.randn(2, 4, 8, 6, generator=rng, dtype=torch.float64)
    got = ssd(x, dt, A, Bm, Cm, D=D, dt_bias=dt_bias, initial_state=state, output_final_state=True,
              chunk_size=chunk_size, dt_limit=(0.05, 3.0))
    want, final = _oracle(x, dt, A, Bm, Cm, D, dt_bias, state, dt_limit=(0.05, 3.0))
    np.testing.assert_allclose(got.output.numpy(), want, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got.final_state.numpy(), final, rtol=1e-10, atol=1e-10)


def test_equal_to_transformers_chunk_scan_and_state_update_in_float32(rng):
    mamba2 = pytest.importorskip("transformers.models.mamba2.modeling_mamba2")
    x, dt, A, Bm, Cm, D, dt_bias = _inputs(rng, L=50, dtype=torch.float32)
    got = ssd(x, dt, A, Bm, Cm, D=D, dt_bias=dt_bias, output_final_state=True, chunk_size=16)
    y, final = mamba2.mamba2_chunk_scan(x.transpose(1, 2), dt.transpose(1, 2), A, Bm.transpose(1, 2),
                                        Cm.transpose(1, 2), chunk_size=16, D=D, dt_bias=dt_bias, dt_softplus=True,
                                        return_final_states=True)
    torch.testing.assert_close(got.output, y.transpose(1, 2), rtol=2e-4, atol=2e-4)
    torch.testing.assert_close(got.final_state, final.transpose(-1, -2), rtol=2e-4, atol=2e-4)
    # one more token from the state, as transformers' decoding step takes it
    x1, dt1, _, B1, C1, _, _ = _inputs(rng, L=1, dtype=torch.float32)
    step = ssd(x1, dt1, A, B1, C1, D=D, dt_bias=dt_bias, initial_state=got.final_state)
    theirs_state = final.clone()
    theirs = mamba2.mamba2_selective_state_update(theirs_state, x1[:, :, 0], dt1[:, :, 0, None].expand(-1, -1, 6),
                                                   A[:, None, None].expand(-1, 6, 8), B1[:, :, 0], C1[:, :, 0],
                                                   D=D[:, None].expand(-1, 6), dt_bias=dt_bias[:, None].expand(-1, 6),
                                                   dt_softplus=True)
    torch.testing.assert_close(step.output[:, :, 0], theirs, rtol=2e-4, atol=2e-4)


def test_the_implicit_attention_matrix_reproduces_the_output(rng):
    x, dt, A, Bm, Cm, D, dt_bias = _inputs(rng, L=30)
    step, g = ssd_decays(dt, A, dt_bias=dt_bias)
    M = implicit_attention(Cm, Bm, g, None, scale=1.0, num_heads=4)  # (B, H, L, L): y - D x = M (dt x)
    torch.testing.assert_close(M @ (x * step[..., None]) + D[:, None, None] * x,
                               ssd(x, dt, A, Bm, Cm, D=D, dt_bias=dt_bias).output, rtol=1e-10, atol=1e-10)


def test_a_padded_token_writes_nothing_and_gets_zeros(rng):
    x, dt, A, Bm, Cm, D, dt_bias = _inputs(rng, L=20)
    real = torch.ones(2, 20, dtype=torch.bool)
    real[1, :3] = False
    got = ssd(x, dt, A, Bm, Cm, D=D, dt_bias=dt_bias, key_mask=real, chunk_size=8)
    alone = ssd(x[1:, :, 3:], dt[1:, :, 3:], A, Bm[1:, :, 3:], Cm[1:, :, 3:], D=D, dt_bias=dt_bias)
    torch.testing.assert_close(got.output[1, :, 3:], alone.output[0], rtol=1e-10, atol=1e-10)
    assert (got.output[1, :, :3] == 0).all()


def test_wrong_input_is_named(rng):
    x, dt, A, Bm, Cm, D, dt_bias = _inputs(rng)
    with pytest.raises(ValueError, match=r"A must have shape \(H,\)"):
        ssd(x, dt, A[:2], Bm, Cm)
    with pytest.raises(ValueError, match=r"dt must have shape \(B, H, L\)"):
        ssd(x, dt[..., :3], A, Bm, Cm)
    with pytest.raises(ValueError, match=r"dt and A must give a finite log-decay .* A = 1\.\d+ at batch 0, head 0"):
        ssd(x, dt, -A, Bm, Cm)
    nan_step = dt.clone()
    nan_step[1, 2, 7] = float("nan")
    with pytest.raises(ValueError, match="got dt = nan .* at batch 1, head 2, token 7"):
        ssd(x, nan_step, A, Bm, Cm)
    with pytest.raises(ValueError, match="dt_limit must be"):
        ssd(x, dt, A, Bm, Cm, dt_limit=(1.0, 0.5))
    # every error names ssd's own arguments, not the inner gated linear attention's (q, k, v, g, Hk)
    for call, words in [
        (lambda: ssd(x[:, :3], dt[:, :3], A[:3], Bm, Cm), r"B's groups G=2 must divide x's heads H=3"),
        (lambda: ssd(x, dt, A, Bm, Cm[..., :5]), r"C must have B's shape \(B, G, L, N\) = \(2, 2, 45, 8\)"),
        (lambda: ssd(x, dt, A, Bm[:, :, :9], Cm[:, :, :9]), r"B must have shape \(B, G, L, N\) with B=2, L=45"),
        (lambda: ssd(x, dt, A, Bm, Cm, initial_state=torch.zeros(2, 4, 6, 8)),
         r"initial_state must have shape \(B, H, N, P\) = \(2, 4, 8, 6\)"),
        (lambda: ssd(x, dt, A, Bm, Cm, key_mask=torch.ones(2, 44, dtype=torch.bool)),
         r"key_mask must be boolean .* \(B, L\) = \(2, 45\)"),
        (lambda: ssd(x, dt, A, Bm, Cm, chunk_size=0), "chunk_size must be an int >= 1"),
    ]:
        with pytest.raises(ValueError, match=words):
            call()
    with pytest.raises(TypeError, match="B must be a real floating-point tensor"):
        ssd(x, dt, A, Bm.long(), Cm)


def test_a_padded_tokens_nan_reaches_no_gradient(rng):
    """A NaN or inf in a padded token's x or dt stays out of the gradients of D, dt_bias and A (and of x and dt):
    the padded tokens are selected away before x D, x dt and dt A are formed."""
    x, dt, A, Bm, Cm, D, dt_bias = _inputs(rng, L=20)
    real = torch.ones(2, 20, dtype=torch.bool)
    real[1, :3] = False
    grads = []
    for poison in (False, True):
        leaves = [t.clone().requires_grad_() for t in (x, dt, A, D, dt_bias)]
        lx, ldt, lA, lD, lbias = leaves
        if poison:
            with torch.no_grad():
                lx[1, 0, 1, 2], ldt[1, 3, 0] = float("nan"), float("inf")
        ssd(lx, ldt, lA, Bm, Cm, D=lD, dt_bias=lbias, key_mask=real, chunk_size=8).output.sum().backward()
        grads.append([t.grad for t in leaves])
    for name, clean, poisoned in zip(("x", "dt", "A", "D", "dt_bias"), *grads):
        assert not poisoned.isnan().any(), name
        torch.testing.assert_close(poisoned, clean, rtol=1e-12, atol=1e-12, msg=name)


def test_in_bfloat16_the_steps_and_their_products_are_formed_in_float32(rng):
    """dt (after dt_bias and the softplus), dt x and dt A in float32 as transformers forms them: closer to the
    float64 result than the same call with them formed in bfloat16 (what the input dtype alone gave)."""
    x, dt, A, Bm, Cm, D, dt_bias = _inputs(rng, B=2, H=4, L=64)
    want = ssd(x, dt, A, Bm, Cm, D=D, dt_bias=dt_bias).output
    half = [t.bfloat16() for t in (x, dt, A, Bm, Cm, D, dt_bias)]
    got = ssd(*half[:5], D=half[5], dt_bias=half[6]).output
    assert got.dtype == torch.bfloat16
    step, g = ssd_decays(half[1], half[2], dt_bias=half[6])  # the steps formed in bfloat16, as before
    from attnkit.functional.linear import gated_linear_attention

    rounded = (gated_linear_attention(half[4], half[3], half[0] * step[..., None], g, scale=1.0).output
               + half[0] * half[5][:, None, None])

    def error(y):
        return ((y.double() - want).abs() / want.abs().clamp(min=1e-2)).mean().item()

    assert error(got) < error(rounded)
    assert F.softplus(torch.tensor(0.0)) > 0  # (dt's softplus keeps steps positive: g <= 0 for A <= 0)
