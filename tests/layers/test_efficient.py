"""Efficient variants against float64 formulas and against exact attention."""

from __future__ import annotations

import pytest
import torch

from attnkit import MultiHeadAttention, attention
from attnkit.functional.linear import elu_feature_map, favor_features, linear_attention, orthogonal_projection
from attnkit.layers.efficient import LinearAttention, LinformerAttention, PerformerAttention


def _naive_linear(phi_q, phi_k, v, causal):
    """out_i = sum_j w_ij v_j / sum_j w_ij with w_ij = phi(q_i).phi(k_j), j <= i if causal (float64)."""
    w = phi_q.double() @ phi_k.double().transpose(-2, -1)
    if causal:
        w = torch.tril(w)
    return (w @ v.double()) / w.sum(-1, keepdim=True)


@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_equals_its_formula(rng, causal):
    q, k, v = (torch.randn(2, 3, 97, 16, generator=rng) for _ in range(3))
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
    got = linear_attention(phi_q, phi_k, v, is_causal=causal, chunk=16, eps=0.0)
    torch.testing.assert_close(got.double(), _naive_linear(phi_q, phi_k, v, causal), rtol=1e-5, atol=1e-5)


def test_recurrent_steps_equal_the_causal_parallel_form(rng):
    layer = LinearAttention(24, 4).double()
    x = torch.randn(2, 13, 24, dtype=torch.float64, generator=rng)
    parallel = layer(x, is_causal=True).output
    state, steps = None, []
    for t in range(13):
        out, state = layer.step(x[:, t], state)
        steps.append(out)
    torch.testing.assert_close(torch.stack(steps, 1), parallel, rtol=1e-10, atol=1e-10)
    assert state[0].shape == (2, 4, 6, 6)  # constant size: (B, H, M, Ev)


def test_padded_keys_do_not_contribute(rng):
    layer = LinearAttention(16, 2).double()
    x = torch.randn(1, 9, 16, dtype=torch.float64, generator=rng)
    mask = torch.tensor([[True] * 6 + [False] * 3])
    torch.testing.assert_close(layer(x[:, :4], x, key_mask=mask).output, layer(x[:, :4], x[:, :6]).output)


def test_performer_estimates_softmax_attention_better_with_more_features(rng):
    q, k, v = (torch.randn(1, 4, 64, 16, generator=rng, dtype=torch.float64) * 0.5 for _ in range(3))
    exact = attention(q, k, v).output
    errors = {}
    for m in (8, 64, 512):
        trials = []
        for seed in range(5):
            w = orthogonal_projection(m, 16, generator=torch.Generator().manual_seed(seed)).double()
            out = linear_attention(favor_features(q, w, is_query=True), favor_features(k, w, is_query=False), v)
            trials.append(float((out - exact).abs().mean()))
        errors[m] = sum(trials) / len(trials)
    assert errors[8] > errors[64] > errors[512] and errors[8] > 3 * errors[512]  # ~ 1 / sqrt(M)
    assert errors[512] < 0.2 * float(exact.abs().mean())


def test_linformer_with_identity_projections_is_exact_attention(rng):
    layer = LinformerAttention(24, 4, max_len=11, projected_len=11).double()
    with torch.no_grad():
        layer.key_length_proj.copy_(torch.eye(11))
        layer.value_length_proj.copy_(torch.eye(11))
    mha = MultiHeadAttention(24, 4).double()
    mha.load_state_dict({k: v for k, v in layer.state_dict().items() if "length_proj" not in k})
    x = torch.randn(2, 11, 24, dtype=torch.float64, generator=rng)
    torch.testing.assert_close(layer(x).output, mha(x).output, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="exceeds max_len=11"):
        layer(torch.randn(1, 12, 24, dtype=torch.float64))


def test_performer_layer_runs_causal_and_shapes(rng):
    layer = PerformerAttention(32, 4, num_features=32)
    x = torch.randn(2, 10, 32, generator=rng)
    assert layer(x).output.shape == layer(x, is_causal=True).output.shape == (2, 10, 32)
    # causal: changing a later token leaves earlier outputs unchanged
    y = x.clone()
    y[:, 7] += 1
    torch.testing.assert_close(layer(x, is_causal=True).output[:, :7], layer(y, is_causal=True).output[:, :7])
