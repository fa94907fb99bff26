"""The sdpa backend's folded grouped-query call (``sdpa.folded``): each group's query heads as rows of its one
key head. On CUDA it replaces repeating keys and values per query head (MLA's absorbed decoding: one 576-wide
key head for 128 query heads); here it is held to PyTorch's own grouped SDPA and to the repeated call in
float64, and its rule (:func:`sdpa.foldable`) to the cases where folding is exact."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnkit.functional.backends import sdpa
from attnkit.functional.heads import repeat_kv


def _inputs(B=2, H=8, Hkv=2, L=3, S=11, E=16, Ev=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, E, generator=g, dtype=torch.float64)
    k = torch.randn(B, Hkv, S, E, generator=g, dtype=torch.float64)
    v = torch.randn(B, Hkv, S, Ev, generator=g, dtype=torch.float64)
    return q, k, v


@pytest.mark.parametrize(("H", "Hkv", "L"), [(8, 2, 3), (8, 1, 1), (6, 3, 5), (128, 1, 2)])
def test_folded_equals_repeated_keys_and_torch_grouped_sdpa(H, Hkv, L):
    q, k, v = _inputs(H=H, Hkv=Hkv, L=L)
    got = sdpa.folded(q, k, v, None, {"scale": 0.3, "dropout_p": 0.0, "enable_gqa": True})
    groups = H // Hkv
    want = F.scaled_dot_product_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), scale=0.3)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, scale=0.3, enable_gqa=True),
                               rtol=1e-12, atol=1e-12)


def test_folded_decoding_row_with_a_padding_mask_per_batch_row():
    q, k, v = _inputs(B=3, H=8, Hkv=1, L=1, S=9)
    mask = torch.ones(3, 1, 1, 9, dtype=torch.bool)
    mask[1, ..., :4] = False
    mask[2, ..., 7:] = False
    got = sdpa.folded(q, k, v, mask, {"scale": None, "dropout_p": 0.0, "enable_gqa": True})
    want = F.scaled_dot_product_attention(q, repeat_kv(k, 8), repeat_kv(v, 8), attn_mask=mask)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_fold_is_taken_only_where_it_is_exact():
    q1, _, _ = _inputs(L=1)
    q3, _, _ = _inputs(L=3)
    shared_row = torch.ones(2, 1, 1, 11, dtype=torch.bool)
    assert sdpa.foldable(q3, None, is_causal=False)
    assert sdpa.foldable(q1, shared_row, is_causal=False)
    assert not sdpa.foldable(q3, None, is_causal=True)  # causal rows differ within a fold
    assert not sdpa.foldable(q3, torch.ones(2, 1, 3, 11, dtype=torch.bool), is_causal=False)  # copied G times
    assert not sdpa.foldable(q1, torch.ones(2, 8, 1, 11, dtype=torch.bool), is_causal=False)  # per-head mask
