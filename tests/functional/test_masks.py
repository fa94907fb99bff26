"""Masks against the oracle's definitions, combinators and converters."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnkit import masks, reference


@pytest.mark.parametrize("L, S", [(5, 5), (3, 7), (7, 3), (1, 4)])
@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
def test_causal_and_sliding_window_match_the_oracle(L, S, align):
    assert np.array_equal(masks.causal(L, S, causal_align=align).numpy(), reference.causal_mask(L, S, align))
    for window in (1, 2, 5, 100):
        got = masks.sliding_window(L, S, window, causal_align=align).numpy()
        assert np.array_equal(got, reference.sliding_window_mask(L, S, window, align))


def test_causal_positions_match_the_oracle_for_any_order_of_positions():
    """The mask from position tensors (a fixed cache's columns, a ring shard's global positions),
    against the oracle's bottom-right window applied to the positions' own order."""
    rng = torch.Generator().manual_seed(0)
    q_pos, k_pos = torch.randperm(12, generator=rng)[:5], torch.randperm(12, generator=rng)
    for window in (None, 1, 3, 100):
        got = masks.causal_positions(q_pos, k_pos, window).numpy()
        dense = reference.causal_mask(12, 12, "top-left") if window is None else \
            reference.sliding_window_mask(12, 12, window, "top-left")
        assert np.array_equal(got, dense[q_pos.numpy()][:, k_pos.numpy()])


def test_bottom_right_lets_the_last_query_see_every_key():
    mask = masks.causal(3, 8, causal_align="bottom-right")
    assert mask[-1].all() and mask[0].sum() == 6
    assert masks.causal(3, 8)[0].sum() == 1  # top-left: first query sees key 0 only


def test_padding_and_key_padding_conversion():
    lengths = torch.tensor([3, 0, 5])
    mask = masks.padding(lengths, 5)
    assert mask.shape == (3, 1, 1, 5)
    assert np.array_equal(mask[:, 0, 0].numpy(), reference.padding_mask([3, 0, 5], 5))
    key_padding = ~mask[:, 0, 0]  # nn.MultiheadAttention convention: True = ignore
    assert torch.equal(masks.from_key_padding_mask(key_padding), mask)


def test_local_window_around_real_centres():
    centers = torch.tensor([0.0, 2.5, 9.0])
    got = masks.local(3, 10, centers, 2)
    assert np.array_equal(got.numpy(), reference.local_mask(10, [0.0, 2.5, 9.0], 2))
    batched = masks.local(3, 10, centers.expand(2, 3), 2)
    assert batched.shape == (2, 1, 3, 10) and torch.equal(batched[1, 0], got)


def test_and_or_combinators_broadcast_explicitly():
    causal = masks.causal(4, 4)
    pad = masks.padding(torch.tensor([2, 4]), 4)
    both = masks.and_masks(causal, pad)
    assert both.shape == (2, 1, 4, 4)
    assert torch.equal(both[0, 0], causal & torch.tensor([True, True, False, False]))
    either = masks.or_masks(causal, pad)
    assert torch.equal(either[1, 0], torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(4, 4\), \(3, 3\)"):
        masks.and_masks(causal, masks.causal(3, 3))


def test_from_additive_accepts_zero_and_minus_inf_only():
    additive = torch.tensor([[0.0, float("-inf")], [torch.finfo(torch.float32).min, 0.0]])
    assert torch.equal(masks.from_additive(additive), torch.tensor([[True, False], [False, True]]))
    with pytest.raises(ValueError, match="bias"):
        masks.from_additive(torch.tensor([[0.0, -1.5]]))


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: masks.causal(4, 4, causal_align="middle"), "causal_align"),
        (lambda: masks.sliding_window(4, 4, 0), "window must be a positive int"),
        (lambda: masks.padding(torch.tensor([[1, 2]]), 4), "lengths must be a 1-D tensor"),
        (lambda: masks.padding(torch.tensor([5]), 4), "[0, S=4]"),
        (lambda: masks.local(3, 5, torch.zeros(4), 1), "centers must have shape (L,) or (B, L) with L=3"),
        (lambda: masks.from_key_padding_mask(torch.zeros(2, 3)), "key_padding_mask must be boolean"),
    ],
)
def test_bad_mask_arguments_raise_with_their_names(call, words):
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    assert words in str(info.value)
