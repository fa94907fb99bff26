"""MultiHeadAttention with a block mask: the same numbers as with its dense boolean equivalent."""

from __future__ import annotations

import pytest
import torch

from attnkit.layers import MultiHeadAttention

D, H, HKV = 24, 4, 2


@pytest.mark.parametrize("backend", ["tiled", "sdpa", "reference", "auto"])
def test_multihead_attention_takes_any_block_mask(backend, rng):
    from attnkit import masks

    torch.manual_seed(0)
    layer = MultiHeadAttention(D, H, HKV, backend=backend).double().eval()
    x = torch.randn(2, 50, D, dtype=torch.float64, generator=rng)
    flags = torch.zeros(2, 50, dtype=torch.bool)
    flags[0, 3] = flags[1, 40] = True
    blocks = masks.block_mask(masks.longformer_mod(10, flags), 2, None, 50, 50, block=16)
    got = layer(x, mask=blocks, need_weights=True)
    want = layer(x, mask=blocks.to_dense(), need_weights=True)
    torch.testing.assert_close(got.output, want.output)
    torch.testing.assert_close(got.weights, want.weights)
