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

    for retired in ("load_for_inspection", "seq2seq_attentions", "InspectedModel", "FAMILIES"):  # past their release
        assert not hasattr(attnkit.hf, retired)


def test_layers_take_key_value_key_mask_and_the_old_names_warn():
    torch.manual_seed(0)
    from attnkit.layers import BahdanauAttention, LuongAttention

    query, key = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    real = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    for layer in (BahdanauAttention(8, 8, 6), LuongAttention(8, score="general", mode="local-p", half_width=2)):
        new = layer(query, key=key, value=key, key_mask=real)
        with pytest.warns(FutureWarning, match="use key_mask="):
            old = layer(query, keys=key, values=key, mask=real)
        assert torch.equal(old.output, new.output) and torch.equal(old.weights, new.weights)
        assert torch.equal(layer(query, key, key, real).output, new.output)  # positions as before
        with pytest.raises(TypeError, match="pass key= only"):
            layer(query, key, keys=key)
    with pytest.warns(FutureWarning, match="use half_width="):
        luong = LuongAttention(8, mode="local-m", window=3)
    assert luong.half_width == 3
    with pytest.warns(FutureWarning, match="use half_width="):
        assert luong.window == 3


def test_the_two_sided_band_is_width_and_window_is_the_causal_look_back():
    from attnkit.functional import block_patterns as patterns
    from attnkit.layers import SelfAttention

    flags = torch.zeros(24, dtype=torch.bool)
    flags[3] = True
    pairs = [(lambda: masks.window_mod(6), lambda: masks.window_mod(window=6)),
             (lambda: masks.dilated_window_mod(6, 2), lambda: masks.dilated_window_mod(window=6, dilation=2)),
             (lambda: masks.longformer_mod(6, flags), lambda: masks.longformer_mod(window=6, global_tokens=flags))]
    for new_call, old_call in pairs:
        new = masks.block_mask(new_call(), None, None, 24, 24, block=8).to_dense()
        with pytest.warns(FutureWarning, match="use width="):
            old = masks.block_mask(old_call(), None, None, 24, 24, block=8).to_dense()
        assert torch.equal(old, new)
    with pytest.warns(FutureWarning, match="use width="):
        assert torch.equal(patterns.window_block_mask(24, window=6).kinds, patterns.window_block_mask(24, width=6).kinds)
    with pytest.warns(FutureWarning, match="use width="):
        assert torch.equal(patterns.longformer_block_mask(6, flags).kinds,
                           patterns.longformer_block_mask(window=6, global_tokens=flags).kinds)
    with pytest.warns(FutureWarning, match="option window= is deprecated, use width="):
        assert torch.equal(masks.pattern_block_mask("longformer", 256, window=32).kinds,
                           masks.pattern_block_mask("longformer", 256, width=32).kinds)
    with pytest.warns(FutureWarning, match="use window_blocks="):
        old = masks.bigbird_mod(64, window=3, block=8)
    assert old.random_table.equal(masks.bigbird_mod(64, window_blocks=3, block=8).random_table)
    causal = patterns.window_block_mask(24, window=6, causal=True).to_dense()  # window: the causal look-back
    assert torch.equal(causal[0, 0], masks.sliding_window(24, 24, 6))
    with pytest.raises(TypeError, match="a causal window is window= alone"):
        patterns.window_block_mask(24, width=6, causal=True)
    with pytest.warns(FutureWarning, match="use head_dim="):
        layer = SelfAttention(16, d_k=8)
    assert layer.head_dim == 8


def test_causal_mods_take_causal_align_and_the_integer_offset_warns():
    L, S = 5, 9
    bottom_right = masks.block_mask(masks.causal_mod(L, S, causal_align="bottom-right"), None, None, L, S).to_dense()
    assert torch.equal(bottom_right[0, 0], masks.causal(L, S, causal_align="bottom-right"))
    for old in ({"offset": S - L}, None):
        with pytest.warns(FutureWarning, match="use causal_align="):
            mod = masks.causal_mod(**old) if old else masks.causal_mod(S - L)  # the old positional form too
        assert torch.equal(masks.block_mask(mod, None, None, L, S).to_dense(), bottom_right)
    sinks = masks.block_mask(masks.sinks_window_mod(2, 3, L, S, causal_align="bottom-right"), None, None, L, S)
    with pytest.warns(FutureWarning, match="use causal_align="):
        old = masks.block_mask(masks.sinks_window_mod(2, 3, offset=S - L), None, None, L, S)
    assert torch.equal(old.to_dense(), sinks.to_dense())
    with pytest.raises(ValueError, match="causal_align='bottom-right' needs L and S"):
        masks.causal_mod(causal_align="bottom-right")


def test_the_old_hybrid_cost_module_warns_and_gives_attnkit_costs_names():
    import importlib
    import sys

    sys.modules.pop("attnkit.hybrid_cost", None)
    with pytest.warns(FutureWarning, match="attnkit.hybrid_cost is now part of attnkit.cost"):
        old = importlib.import_module("attnkit.hybrid_cost")
    import attnkit.cost

    assert old.hybrid_memory is attnkit.cost.hybrid_memory and old.HYBRID_PRESETS is attnkit.cost.HYBRID_PRESETS
