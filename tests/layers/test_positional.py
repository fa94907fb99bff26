"""Positional encodings against the oracle and their defining properties."""

from __future__ import annotations

import pytest
import torch

from attnkit import reference
from attnkit.layers import (
    ALiBi,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    alibi_slopes,
    sinusoidal_table,
)

from helpers import assert_close, numpy, randn


def test_sinusoidal_matches_the_vaswani_formula_and_lies_in_unit_range():
    table = sinusoidal_table(100, 512, dtype=torch.float64)
    assert table.shape == (100, 512)
    assert table.min() >= -1 and table.max() <= 1
    assert_close(table[:, :64], reference.sinusoidal(100, 512)[:, :64], torch.float64)
    assert_close(sinusoidal_table(7, 5, dtype=torch.float64), reference.sinusoidal(7, 5), torch.float64)


def test_sinusoidal_module_adds_the_table_at_an_offset():
    module = SinusoidalPositionalEncoding(16, max_len=50)
    x = torch.zeros(2, 5, 16)
    torch.testing.assert_close(module(x, offset=3)[1], sinusoidal_table(50, 16)[3:8])
    with pytest.raises(ValueError, match="max_len=50"):
        module(torch.zeros(1, 60, 16))


def test_learned_positions_are_parameters():
    module = LearnedPositionalEmbedding(10, 4)
    assert sum(p.numel() for p in module.parameters()) == 40
    x = torch.zeros(1, 3, 4)
    torch.testing.assert_close(module(x, offset=2)[0], module.embedding.weight[2:5])


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_matches_the_oracle(interleaved, rng):
    rope = RotaryEmbedding(10, base=500.0, interleaved=interleaved)
    x = randn(2, 3, 7, 10, dtype=torch.float64, generator=rng)
    got = rope(x, offset=4)
    assert_close(got, reference.rope(numpy(x), range(4, 11), base=500.0, interleaved=interleaved), torch.float32)


@pytest.mark.parametrize("explicit", [False, True])
def test_a_float64_model_rotates_in_float64(explicit, rng):
    """Position tables are at least float32 and at least the model's dtype: a float64 model equals
    the float64 oracle to 1e-12 even at position 30,000 (float32 angles are off by ~1e-3 there)."""
    rope = RotaryEmbedding(16, base=10000.0).double()
    x = randn(1, 2, 5, 16, dtype=torch.float64, generator=rng)
    positions = range(30000, 30005)
    got = rope(x, positions=torch.arange(30000, 30005)) if explicit else rope(x, offset=30000)
    torch.testing.assert_close(got, torch.from_numpy(reference.rope(numpy(x), positions, base=10000.0)),
                               rtol=1e-12, atol=1e-12)
    in_half = rope(x.to(torch.bfloat16), offset=30000)  # half types still rotate in float32 (transformers' way)
    assert in_half.dtype == torch.bfloat16


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_is_bit_for_bit_the_pairwise_rotation(interleaved, rng):
    """RotaryEmbedding rotates by x * cos + partner * signed sin (four kernels); that is exactly
    (x1 cos - x2 sin, x2 cos + x1 sin) per pair, in float32 as in float64."""
    rope = RotaryEmbedding(12, interleaved=interleaved)
    x = randn(2, 3, 5, 12, generator=rng)
    positions = torch.tensor([[0, 4, 9, 20, 33], [7, 7, 8, 1000, 2]])
    cos, sin = rope.angles(positions)
    cos, sin = cos[:, None], sin[:, None]
    x1, x2 = (x[..., 0::2], x[..., 1::2]) if interleaved else x.chunk(2, dim=-1)
    first, second = x1 * cos - x2 * sin, x1 * sin + x2 * cos
    expected = torch.stack((first, second), -1).flatten(-2) if interleaved else torch.cat((first, second), -1)
    assert torch.equal(rope(x, positions=positions), expected)


def test_rotary_reuses_the_factors_of_one_positions_tensor_within_one_model_call(rng, monkeypatch):
    """The layers of a model share one RotaryEmbedding and rotate queries and keys at the same
    positions: within one model call (``kept.one_call``) the angles are computed once per positions
    tensor; outside one, and in the next call, again (a tensor rewritten between calls is read afresh),
    inference tensors included."""
    from attnkit.functional import kept

    rope = RotaryEmbedding(8)
    calls = []
    angles = rope.angles
    monkeypatch.setattr(rope, "angles", lambda *a, **k: calls.append(1) or angles(*a, **k))
    x = randn(2, 1, 3, 8, generator=rng)
    positions = torch.tensor([[3, 4, 5], [0, 1, 2]])
    with kept.one_call():
        first = rope(x, positions=positions)
        assert torch.equal(rope(x, positions=positions), first) and len(calls) == 1
        rope(x, positions=positions.clone())  # an equal but other tensor: computed again (no look at the values)
        assert len(calls) == 2
    positions.data += 10  # behind the version counter, between calls: read afresh
    assert torch.equal(rope(x, positions=positions), RotaryEmbedding(8)(x, positions=positions.clone()))
    assert len(calls) == 3
    rope(x, positions=positions)  # outside a model call: nothing kept
    assert len(calls) == 4
    with torch.inference_mode(), kept.one_call():  # inference tensors: kept within the call as any other
        frozen = torch.tensor([[3, 4, 5], [0, 1, 2]])
        assert torch.equal(rope(x, positions=frozen), first)
        assert torch.equal(rope(x, positions=frozen), first)
    assert len(calls) == 5
    rope.double()  # a cast: the table of the old dtype is dropped, explicit positions in float64 computed anew
    assert rope(x.double(), positions=positions).dtype == torch.float64 and len(calls) == 6


def test_float64_sinusoids_are_float64():
    module = SinusoidalPositionalEncoding(16, max_len=50).double()
    got = module(torch.zeros(1, 5, 16, dtype=torch.float64), offset=40)[0]
    torch.testing.assert_close(got, torch.from_numpy(reference.sinusoidal(50, 16)[40:45]), rtol=1e-15, atol=1e-15)


def test_rotary_scores_depend_only_on_relative_position(rng):
    rope = RotaryEmbedding(16)
    q, k = randn(1, 1, 1, 16, generator=rng), randn(1, 1, 1, 16, generator=rng)
    def score(i, j):
        return (rope(q, offset=i) * rope(k, offset=j)).sum().item()
    assert score(3, 1) == pytest.approx(score(103, 101), rel=1e-4)
    assert score(3, 1) != pytest.approx(score(3, 2), rel=1e-3)


def test_alibi_slopes_from_the_paper():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(k + 1) for k in range(8)]))
    for heads in (1, 6, 12, 16):
        assert_close(alibi_slopes(heads), reference.alibi_slopes(heads), torch.float32)


@pytest.mark.parametrize("symmetric", [False, True])
def test_alibi_bias_matches_the_oracle(symmetric):
    module = ALiBi(6, symmetric=symmetric)
    got = module(4, 9)
    assert got.shape == (1, 6, 4, 9)
    assert_close(got, reference.alibi_bias(reference.alibi_slopes(6), 4, 9, symmetric=symmetric), torch.float32)
