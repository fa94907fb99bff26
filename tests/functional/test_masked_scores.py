"""A masked key stays masked whatever a score_mod or a bias makes of its score, and a row a NaN reaches is
NaN everywhere, in every backend (docs/semantics.md), held to the float64 oracle (attnkit.reference)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import attnkit
from attnkit import masks, reference

from helpers import numpy, randn, slow

BACKENDS = ["reference", "tiled", "auto", slow("flex")]


def _poison_masked(score, b, h, q_idx, kv_idx):
    """NaN and inf only at keys a causal window of 2 rules out: after the query (NaN, two or more after it
    inf) and two or more before it (inf). Every allowed score is left as it is."""
    score = torch.where(kv_idx > q_idx, torch.full_like(score, math.nan), score)
    score = torch.where(kv_idx > q_idx + 1, torch.full_like(score, math.inf), score)
    return torch.where(kv_idx <= q_idx - 2, torch.full_like(score, math.inf), score)


@pytest.mark.parametrize("structure", ["causal", "window", "block_mask"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_score_mods_nan_or_inf_at_a_masked_key_stays_masked(backend, structure, rng, monkeypatch):
    """is_causal, window and a BlockMask rule keys out after the score_mod (FlexAttention's order): a NaN
    or inf the score_mod puts there made whole rows NaN in the tiled loop (and auto)."""
    from attnkit.functional.backends import flex

    monkeypatch.setattr(flex, "COMPILE_ON_CPU", False)
    L = S = 9
    q, k, v = (randn(1, 2, L, 8, dtype=torch.float64, generator=rng) for _ in range(3))
    if structure == "causal":  # causal alone leaves key i - 2 allowed: poison only what it rules out
        kwargs: dict = {"is_causal": True}

        def score_mod(score, b, h, q_idx, kv_idx):
            return torch.where(kv_idx > q_idx, torch.full_like(score, math.nan), score)
    else:
        score_mod = _poison_masked
        kwargs = {"window": 2} if structure == "window" else {
            "mask": masks.BlockMask.from_dense(masks.sliding_window(L, S, 2), block=4)}
    with torch.no_grad():
        got = attnkit.attention(q, k, v, score_mod=score_mod, backend=backend, **kwargs).output
    oracle_kwargs = {"is_causal": True} if structure == "causal" else {"window": 2}
    expected, _, _ = reference.attention(numpy(q), numpy(k), numpy(v), **oracle_kwargs)
    assert not got.isnan().any()
    np.testing.assert_allclose(numpy(got), expected, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("backend", ["reference", "sdpa", "tiled", "auto"])
def test_a_nan_bias_at_an_allowed_key_makes_the_whole_row_nan_weights_included(backend, rng):
    """The reference backend left the row's masked keys at 0 while its output was NaN."""
    q, k, v = (randn(1, 2, 4, 8, generator=rng) for _ in range(3))
    bias = torch.zeros(4, 4)
    bias[1, 0] = math.nan  # allowed under causality
    bias[3, 3] = math.nan  # allowed
    bias[0, 2] = math.nan  # masked under causality: changes nothing
    result = attnkit.attention(q, k, v, bias=bias, is_causal=True, backend=backend, need_weights=True)
    for row in (1, 3):
        assert result.output[:, :, row].isnan().all() and result.weights[:, :, row].isnan().all(), row
    for row in (0, 2):
        assert not result.output[:, :, row].isnan().any() and not result.weights[:, :, row].isnan().any(), row
