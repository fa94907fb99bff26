"""Names renamed for one vocabulary (docs/semantics.md, glossary) still work for one release: the
old name warns (FutureWarning naming the new one) and gives the same result; passing both is an
error."""

from __future__ import annotations

import pytest
import torch

from attnkit import masks
from attnkit.functional.linear import elu_feature_map, linear_attention
from attnkit.layers import LinearAttention, LongformerSelfAttention, PerformerAttention


def test_align_is_now_causal_align():
    with pytest.warns(FutureWarning, match="use causal_align="):
        old = masks.causal(3, 8, align="bottom-right")
    assert torch.equal(old, masks.causal(3, 8, causal_align="bottom-right"))
    with pytest.warns(FutureWarning, match="use causal_align="):
        old = masks.sliding_window(3, 8, 2, align="bottom-right")
    assert torch.equal(old, masks.sliding_window(3, 8, 2, causal_align="bottom-right"))
    with pytest.raises(TypeError, match="pass causal_align= only"):
        masks.causal(3, 8, align="bottom-right", causal_align="bottom-right")


def test_and_mods_is_now_and_masks_which_takes_mask_mods_as_flex_does():
    window, causal = masks.window_mod(4), masks.causal_mod()
    new = masks.block_mask(masks.and_masks(window, causal), None, None, 16, 16, block=4).to_dense()
    with pytest.warns(FutureWarning, match="use and_masks"):
        old = masks.block_mask(masks.and_mods(window, causal), None, None, 16, 16, block=4).to_dense()
    assert torch.equal(old, new)
    assert torch.equal(new[0, 0], masks.and_masks(masks.causal(16), masks.local(16, 16, torch.arange(16), 2)))
    with pytest.warns(FutureWarning, match="use or_masks"):
        either = masks.or_mods(window, causal)
    assert torch.equal(masks.block_mask(either, None, None, 16, 16, block=4).to_dense(),
                       masks.block_mask(masks.or_masks(window, causal), None, None, 16, 16, block=4).to_dense())
    with pytest.raises(TypeError, match="boolean tensors or mask_mods"):
        masks.and_masks(masks.causal(4), causal)


def test_causal_is_now_is_causal_in_linear_attention():
    torch.manual_seed(0)
    x = torch.randn(2, 10, 32)
    for layer in (LinearAttention(32, 4), PerformerAttention(32, 4, num_features=16)):
        with pytest.warns(FutureWarning, match="use is_causal="):
            old = layer(x, causal=True)
        torch.testing.assert_close(old, layer(x, is_causal=True), rtol=0, atol=0)
    phi = elu_feature_map(torch.randn(1, 2, 8, 4))
    v = torch.randn(1, 2, 8, 3)
    with pytest.warns(FutureWarning):
        old = linear_attention(phi, phi, v, causal=True)
    assert torch.equal(old, linear_attention(phi, phi, v, is_causal=True))


def test_padding_mask_is_now_key_mask_in_longformer():
    torch.manual_seed(0)
    layer = LongformerSelfAttention(32, 4, window=4).eval()
    x = torch.randn(2, 12, 32)
    real = torch.ones(2, 12, dtype=torch.bool)
    real[1, 9:] = False
    with pytest.warns(FutureWarning, match="use key_mask="):
        old = layer(x, padding_mask=real).output
    assert torch.equal(old, layer(x, key_mask=real).output)
    assert torch.equal(old, layer(x, None, real).output)  # third positional argument, as before


def test_moved_names_still_resolve_from_their_old_homes():
    from attnkit.models import pretrained

    with pytest.warns(FutureWarning, match="NAME_FAMILIES"):
        assert pretrained.FAMILIES == pretrained.NAME_FAMILIES == ("bert", "gpt2", "llama")
    pytest.importorskip("transformers")
    import attnkit.hf
    from attnkit.inspect import hf_models

    with pytest.warns(FutureWarning, match="attnkit.inspect.hf_models.load_for_inspection"):
        assert attnkit.hf.load_for_inspection is hf_models.load_for_inspection
