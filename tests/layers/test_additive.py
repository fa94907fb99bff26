"""BahdanauAttention against the oracle."""

from __future__ import annotations

import pytest
import torch

from attnkit import BahdanauAttention, reference

from helpers import assert_close, numpy, randn


def oracle(layer: BahdanauAttention, query, keys, values=None, mask=None, temperature=1.0):
    bias = layer.query_proj.bias is not None
    return reference.bahdanau(
        numpy(query), numpy(keys), numpy(keys if values is None else values),
        numpy(layer.query_proj.weight), numpy(layer.key_proj.weight), numpy(layer.score_proj.weight[0]),
        mask=numpy(mask),
        b_q=numpy(layer.query_proj.bias) if bias else None,
        b_k=numpy(layer.key_proj.bias) if bias else None,
        temperature=temperature,
    )


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_matches_the_oracle_with_padding(dtype, bias, rng):
    layer = BahdanauAttention(12, 10, 8, bias=bias).to(dtype)
    query, keys, values = randn(3, 5, 12, dtype=dtype, generator=rng), randn(3, 9, 10, dtype=dtype, generator=rng), randn(3, 9, 6, dtype=dtype, generator=rng)
    mask = torch.arange(9)[None, :] < torch.tensor([9, 4, 1])[:, None]
    context, weights, _ = layer(query, keys, values, mask)
    expected_context, expected_weights = oracle(layer, query, keys, values, mask)
    assert_close(context, expected_context, dtype)
    assert_close(weights, expected_weights, dtype)
    assert (weights[1, :, 4:] == 0).all()


def test_single_step_and_keys_projected_once(rng):
    layer = BahdanauAttention(12, 10, 8).double()
    query, keys = randn(2, 12, dtype=torch.float64, generator=rng), randn(2, 7, 10, dtype=torch.float64, generator=rng)
    context, weights, _ = layer(query, keys)
    assert context.shape == (2, 10) and weights.shape == (2, 7)
    projected = layer.project_keys(keys)
    again = layer(query, keys, projected_keys=projected)
    torch.testing.assert_close(again[0], context)
    expected_context, _ = oracle(layer, query[:, None], keys)
    assert_close(context, expected_context[:, 0], torch.float64)


def test_parameter_count_from_the_literature():
    """d_h = d_s = 256, d_a = 128, no bias: W_a and U_a are 256 x 128, v_a has 128 entries."""
    layer = BahdanauAttention(256, 256, 128)
    assert sum(p.numel() for p in layer.parameters()) == 65_664


def test_errors_name_the_argument():
    layer = BahdanauAttention(4, 6, 3)
    with pytest.raises(ValueError, match="query must have last dim 4"):
        layer(torch.randn(2, 5), torch.randn(2, 3, 6))
    with pytest.raises(ValueError, match=r"mask must have shape \(B, S\) = \(2, 3\)"):
        layer(torch.randn(2, 4), torch.randn(2, 3, 6), mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="projected_keys"):
        layer(torch.randn(2, 4), torch.randn(2, 3, 6), projected_keys=torch.randn(2, 3, 4))
