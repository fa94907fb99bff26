"""Score functions and the masked softmax against the oracle, and facts from the literature."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnkit import masked_softmax, reference, scores

from helpers import assert_close, numpy, randn


def test_dot_general_additive_concat_match_the_oracle(rng):
    q, k = randn(5, 6, dtype=torch.float64, generator=rng), randn(7, 4, dtype=torch.float64, generator=rng)
    W = randn(6, 4, dtype=torch.float64, generator=rng)
    assert_close(scores.general(q, k, weight=W), reference.general_score(numpy(q), numpy(k), numpy(W)), torch.float64)
    q2 = randn(5, 4, dtype=torch.float64, generator=rng)
    assert_close(scores.dot(q2, k), reference.dot_score(numpy(q2), numpy(k)), torch.float64)
    assert_close(scores.scaled_dot(q2, k), reference.dot_score(numpy(q2), numpy(k)) / 2.0, torch.float64)
    W_q, W_k, v = (randn(3, 6, dtype=torch.float64, generator=rng), randn(3, 4, dtype=torch.float64, generator=rng), randn(3, dtype=torch.float64, generator=rng))
    expected = reference.additive_score(numpy(q), numpy(k), numpy(W_q), numpy(W_k), numpy(v))
    assert_close(scores.additive(q, k, v=v, w_q=W_q, w_k=W_k), expected, torch.float64)
    # Projecting the keys once and passing them in gives the same scores.
    assert_close(scores.additive(q, k @ W_k.T, v=v, w_q=W_q), expected, torch.float64)
    W_c = torch.cat([W_q, W_k], dim=1)
    assert_close(scores.concat(q, k, weight=W_c, v=v), reference.concat_score(numpy(q), numpy(k), numpy(W_c), numpy(v)), torch.float64)


def test_scores_take_leading_batch_dims(rng):
    q, k = randn(2, 3, 5, 8, generator=rng), randn(2, 3, 7, 8, generator=rng)
    assert scores.dot(q, k).shape == (2, 3, 5, 7)
    W_q, W_k, v = randn(4, 8, generator=rng), randn(4, 8, generator=rng), randn(4, generator=rng)
    assert scores.additive(q, k, v=v, w_q=W_q, w_k=W_k).shape == (2, 3, 5, 7)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 3.0])
def test_masked_softmax_matches_the_oracle(temperature, rng):
    s = randn(3, 4, 9, dtype=torch.float64, generator=rng)
    mask = torch.rand(3, 4, 9, generator=rng) < 0.6
    mask[0, 1] = False
    got = masked_softmax(s, mask, temperature=temperature)
    assert_close(got, reference.softmax(numpy(s), numpy(mask), temperature), torch.float64)
    assert (got[0, 1] == 0).all() and not torch.isnan(got).any()


def test_temperature_to_zero_gives_a_one_hot_alignment(rng):
    s = randn(6, 11, generator=rng)
    hard = masked_softmax(s, temperature=1e-4)
    assert torch.equal(hard, torch.nn.functional.one_hot(s.argmax(-1), 11).float())
    flat = masked_softmax(s, temperature=1e4)
    torch.testing.assert_close(flat, torch.full_like(flat, 1 / 11), atol=1e-3, rtol=0)


def test_scaling_keeps_dot_product_variance_near_one():
    """Vaswani et al. 2017, footnote 4: q.k of unit-variance vectors has variance d_k; / sqrt(d_k) brings it to 1."""
    generator = torch.Generator().manual_seed(0)
    d_k, n = 512, 20000
    q, k = torch.randn(n, d_k, generator=generator, dtype=torch.float64), torch.randn(n, d_k, generator=generator, dtype=torch.float64)
    unscaled = (q * k).sum(-1)
    scaled = unscaled / math.sqrt(d_k)
    # Standard error of a sample variance is about var * sqrt(2 / n), 1% here; allow 5%.
    assert abs(unscaled.var().item() / d_k - 1) < 0.05
    assert abs(scaled.var().item() - 1) < 0.05


def test_score_errors_name_arguments():
    with pytest.raises(ValueError, match="Dq=3 and Dk=4"):
        scores.dot(torch.randn(2, 3), torch.randn(5, 4))
    with pytest.raises(ValueError, match=r"weight must have shape \(3, 4\)"):
        scores.general(torch.randn(2, 3), torch.randn(5, 4), weight=torch.randn(4, 3))
    with pytest.raises(ValueError, match="temperature must be > 0"):
        masked_softmax(torch.randn(2, 3), temperature=0.0)
    with pytest.raises(ValueError, match=r"mask of shape \(2, 4\)"):
        masked_softmax(torch.randn(2, 3), torch.ones(2, 4, dtype=torch.bool))
    assert np.isfinite(numpy(masked_softmax(torch.randn(2, 3), torch.zeros(2, 3, dtype=torch.bool)))).all()
