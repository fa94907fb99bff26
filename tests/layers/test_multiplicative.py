"""LuongAttention: every score and mode against the oracle."""

from __future__ import annotations

import pytest
import torch

from attnkit import LuongAttention, reference

from helpers import assert_close, numpy, randn


def oracle(layer: LuongAttention, query, keys, mask=None, positions=None, temperature=1.0):
    kwargs = {}
    if layer.score == "general":
        kwargs["W"] = numpy(layer.score_weight.weight)
    if layer.score == "concat":
        kwargs.update(W=numpy(layer.concat_proj.weight), v=numpy(layer.score_proj.weight[0]))
    if layer.mode == "local-p":
        kwargs.update(W_p=numpy(layer.position_proj.weight), v_p=numpy(layer.position_score.weight[0]))
    return reference.luong(
        numpy(query), numpy(keys), numpy(keys), score=layer.score, mode=layer.mode, window=layer.window,
        mask=numpy(mask), positions=positions, temperature=temperature, **kwargs,
    )


@pytest.mark.parametrize("mode", ["global", "local-m", "local-p"])
@pytest.mark.parametrize("score", ["dot", "general", "concat"])
def test_matches_the_oracle(score, mode, rng):
    layer = LuongAttention(10, score=score, mode=mode, window=3).double()
    query, keys = randn(2, 6, 10, dtype=torch.float64, generator=rng), randn(2, 15, 10, dtype=torch.float64, generator=rng)
    mask = torch.arange(15)[None, :] < torch.tensor([15, 9])[:, None]
    context, weights, _ = layer(query, keys, mask=mask)
    expected_context, expected_weights = oracle(layer, query, keys, mask=mask)
    assert_close(context, expected_context, torch.float64)
    assert_close(weights, expected_weights, torch.float64)
    if mode != "global":
        assert (weights.count_nonzero(-1) <= 2 * 3 + 1).all(), "local attention stays inside [p_t - D, p_t + D]"


def test_local_m_single_step_takes_the_target_position(rng):
    layer = LuongAttention(8, mode="local-m", window=2).double()
    query, keys = randn(3, 8, dtype=torch.float64, generator=rng), randn(3, 10, 8, dtype=torch.float64, generator=rng)
    context, weights, _ = layer(query, keys, position=torch.tensor([0, 4, 9]))
    _, expected = oracle(layer, query[:, None], keys, positions=[[0], [4], [9]])
    assert_close(weights, expected[:, 0], torch.float64)
    assert weights[1, :2].sum() == 0 and weights[1, 2:7].sum() > 0.999
    with pytest.raises(ValueError, match="needs position"):
        layer(query, keys)


def test_local_p_weights_follow_the_gaussian_and_are_not_renormalised(rng):
    layer = LuongAttention(8, mode="local-p", window=4).double()
    query, keys = randn(2, 3, 8, dtype=torch.float64, generator=rng), randn(2, 20, 8, dtype=torch.float64, generator=rng)
    weights = layer(query, keys).weights
    centers = layer.predict_centers(query, torch.tensor([20, 20]))
    assert ((centers >= 0) & (centers <= 20)).all()
    assert (weights.sum(-1) < 1).all()


def test_temperature_to_zero_gives_hard_alignment(rng):
    layer = LuongAttention(8, score="general").double()
    query, keys = randn(2, 4, 8, dtype=torch.float64, generator=rng), randn(2, 9, 8, dtype=torch.float64, generator=rng)
    soft = layer(query, keys).weights
    hard = layer(query, keys, temperature=1e-6).weights
    assert torch.equal(hard, torch.nn.functional.one_hot(soft.argmax(-1), 9).double())


def test_bad_arguments():
    with pytest.raises(ValueError, match="score must be one of"):
        LuongAttention(4, score="cosine")
    with pytest.raises(ValueError, match="mode must be one of"):
        LuongAttention(4, mode="local")
    with pytest.raises(ValueError, match="key must have last dim 4"):
        LuongAttention(4)(torch.randn(2, 4), torch.randn(2, 3, 5))
