"""SelfAttention (one head) against the oracle."""

from __future__ import annotations

import torch

from attnkit import SelfAttention, reference

from helpers import assert_close, numpy, randn


def test_matches_the_oracle(rng):
    layer = SelfAttention(12, d_k=5).double()
    x = randn(2, 9, 12, dtype=torch.float64, generator=rng)
    result = layer(x, is_causal=True, need_weights=True)
    q, k, v = (numpy(proj(x))[:, None] for proj in (layer.q_proj, layer.k_proj, layer.v_proj))
    expected, weights, _ = reference.attention(q, k, v, is_causal=True)
    assert result.output.shape == (2, 9, 5) and result.weights.shape == (2, 9, 9)
    assert_close(result.output, expected[:, 0], torch.float64)
    assert_close(result.weights, weights[:, 0], torch.float64)
