"""attnkit's LongformerSelfAttention against transformers' with copied weights: a tiny random
config, sequences padded to the window multiple, a batch with different global positions and
padding; in float32 to 1e-5, and in float64 to 1e-10 with transformers' float32 softmax kept in float64
(float64_checks)."""

from __future__ import annotations

import pytest
import torch

from attnkit.layers import LongformerSelfAttention

longformer = pytest.importorskip("transformers.models.longformer.modeling_longformer")
transformers = pytest.importorskip("transformers")

from float64_checks import float64_copy, float64_inside  # noqa: E402

D, H = 32, 4


def _pair(window: int, seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.LongformerConfig(hidden_size=D, num_attention_heads=H, attention_window=[window],
                                           attention_probs_dropout_prob=0.0, num_hidden_layers=1)
    theirs = longformer.LongformerSelfAttention(config, layer_id=0).eval()
    ours = LongformerSelfAttention(D, H, width=window, block=8).eval()
    missing = ours.load_state_dict(theirs.state_dict(), strict=True)
    assert not missing.missing_keys and not missing.unexpected_keys
    return theirs, ours


def _their_mask(real: torch.Tensor, is_global: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The (B, L) mask LongformerModel gives its layers: finfo.min at padding, 0 local, finfo.max global."""
    mask = torch.zeros(real.shape, dtype=dtype)
    mask[~real] = torch.finfo(dtype).min
    mask[is_global] = torch.finfo(dtype).max
    return mask


@pytest.mark.parametrize("window, L", [(8, 32), (16, 48), (4, 40)])
@pytest.mark.parametrize("backend", ["tiled", "reference", "auto"])
def test_equals_transformers_longformer_self_attention(window, L, backend):
    theirs, ours = _pair(window)
    ours.backend = backend
    B = 3
    x = torch.randn(B, L, D)
    real = torch.ones(B, L, dtype=torch.bool)
    real[1, L - 7:] = False  # padding at the end, to the window multiple
    real[2, L - window:] = False
    is_global = torch.zeros(B, L, dtype=torch.bool)
    is_global[0, [0, 5, L - 1]] = True
    is_global[1, [3]] = True  # example 2 has no global token
    mask = _their_mask(real, is_global)
    with torch.no_grad():
        expected, local_probs = theirs(x, attention_mask=mask, is_index_masked=mask < 0,
                                       is_index_global_attn=mask > 0, is_global_attn=True, output_attentions=True)[:2]
        got = ours(x, is_global, real, need_weights=True)
    torch.testing.assert_close(got.output, expected, rtol=1e-5, atol=1e-5)
    # transformers' local weights are (B, L, H, globals + window + 1); compare the window band.
    G = int(is_global.sum(1).max())
    radius = window // 2
    band = local_probs[..., G:]  # (B, L, H, 2 radius + 1), key i - radius + w
    for i in range(L):
        for w in range(2 * radius + 1):
            j = i - radius + w
            if 0 <= j < L and not bool(is_global[:, j].any()):
                torch.testing.assert_close(got.weights[:, :, i, j], band[:, i, :, w], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["tiled", "reference", "auto"])
def test_float64_equals_transformers_to_1e_10_with_globals_padding_and_gradients(backend):
    theirs, ours = _pair(8)
    ours = ours.double()
    ours.backend = backend
    B, L = 3, 32
    x = torch.randn(B, L, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64, requires_grad=True)
    real = torch.ones(B, L, dtype=torch.bool)
    real[1, L - 7:] = False
    is_global = torch.zeros(B, L, dtype=torch.bool)
    is_global[0, [0, 5, L - 1]] = True
    is_global[2, [3]] = True
    mask = _their_mask(real, is_global, torch.float64)
    got = ours(x, is_global, real).output
    with float64_inside():
        expected = float64_copy(theirs)(x, attention_mask=mask, is_index_masked=mask < 0,
                                        is_index_global_attn=mask > 0, is_global_attn=True)[0]
    assert got.dtype == expected.dtype == torch.float64
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)  # every row, the padded ones too
    g_got, = torch.autograd.grad(got.sum(), x)
    g_expected, = torch.autograd.grad(expected.sum(), x)
    torch.testing.assert_close(g_got, g_expected, rtol=1e-10, atol=1e-10)


def test_without_global_tokens_and_with_gradients():
    theirs, ours = _pair(8, seed=1)
    x = torch.randn(2, 24, D, requires_grad=True)
    mask = torch.zeros(2, 24)
    expected = theirs(x, attention_mask=mask, is_index_masked=mask < 0, is_index_global_attn=mask > 0,
                      is_global_attn=False)[0]
    got = ours(x).output
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    g_expected, = torch.autograd.grad(expected.sum(), x)
    g_got, = torch.autograd.grad(got.sum(), x)
    torch.testing.assert_close(g_got, g_expected, rtol=1e-5, atol=1e-5)


def test_bad_inputs_are_named():
    _, ours = _pair(8)
    x = torch.randn(1, 16, D)
    with pytest.raises(ValueError, match="global_tokens must be a boolean tensor of shape"):
        ours(x, torch.zeros(1, 15, dtype=torch.bool))
    with pytest.raises(ValueError, match="global_tokens marks a padding position"):
        ours(x, torch.ones(1, 16, dtype=torch.bool), torch.zeros(1, 16, dtype=torch.bool))
    with pytest.raises(ValueError, match="width must be an even int"):
        LongformerSelfAttention(D, H, width=7)
