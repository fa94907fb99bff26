"""attnkit's block masks and score_mods against PyTorch's compiled ``flex_attention`` (forward, CPU),
with the very same ``mask_mod`` / ``score_mod`` functions. flex_attention has no CPU backward in
torch 2.13; gradients are checked against the float64 oracle in tests/functional/test_block_mask.py."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks

pytestmark = [pytest.mark.slow]  # compiles flex_attention (about 70 s in all)

flex = pytest.importorskip("torch.nn.attention.flex_attention")

L = 256
B, H, E = 2, 4, 16


@pytest.fixture(scope="module")
def compiled():
    """torch.compile(flex_attention) on CPU, or a skip naming why it cannot compile here."""
    function = torch.compile(flex.flex_attention, dynamic=False)  # dynamic shapes hit an inductor CPU bug
    q = torch.randn(1, 1, 128, 16)
    try:
        function(q, q, q)
    except Exception as error:  # noqa: BLE001 - any compile failure means: no compiler here
        pytest.skip(f"torch.compile(flex_attention) is unavailable on this machine: {type(error).__name__}: {error}"[:300])
    return function


def _mods():
    flags = torch.zeros(B, L, dtype=torch.bool)
    flags[0, [0, 1, 2]] = True
    flags[1, [130]] = True
    ids = torch.tensor([[0] * 60 + [1] * 100 + [2] * 96, [0] * 200 + [1] * 50 + [-1] * 6])
    return {
        "window": (masks.window_mod(64), None),
        "longformer": (masks.longformer_mod(64, flags), B),
        "bigbird": (masks.bigbird_mod(L, window_blocks=3, num_global=1, random_blocks=2, block=32, seed=0), None),
        "prefix-lm": (masks.prefix_lm_mod(torch.tensor([10, 150])), B),
        "documents": (masks.document_mod(ids), B),
        "dilated": (masks.dilated_window_mod(32, 2), None),
        "sinks": (masks.sinks_window_mod(4, 48), None),
    }


def _qkv():
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, L, E, generator=generator) for _ in range(3)]


@pytest.mark.parametrize("name", list(_mods()))
def test_block_mask_forward_equals_compiled_flex_attention(name, compiled):
    mod, mask_B = _mods()[name]
    q, k, v = _qkv()
    expected = compiled(q, k, v, block_mask=flex.create_block_mask(mod, mask_B, None, L, L, device="cpu"))
    ours = masks.block_mask(mod, mask_B, None, L, L)
    got = attnkit.attention(q, k, v, mask=ours, backend="tiled").output
    # Rows with no allowed key: flex returns 0 as attnkit does.
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625])


def alibi(score, b, h, q_idx, kv_idx):
    return score + SLOPES[h] * (kv_idx - q_idx)


def softcap(score, b, h, q_idx, kv_idx):
    return 2.0 * torch.tanh(score / 2.0)


@pytest.mark.parametrize("score_mod", [alibi, softcap], ids=["alibi", "softcap"])
def test_score_mod_forward_equals_compiled_flex_attention(score_mod, compiled):
    q, k, v = _qkv()
    mod = masks.causal_mod()
    expected = compiled(q, k, v, score_mod=score_mod, block_mask=flex.create_block_mask(mod, None, None, L, L, device="cpu"))
    got = attnkit.attention(q, k, v, is_causal=True, score_mod=score_mod, backend="tiled").output
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
