"""Transformer encoder-decoder: the paper's parameter counts, torch.nn parity, cached decoding."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from attnkit.models import TransformerConfig, TransformerEncoderDecoder, count_parameters, preset
from attnkit.models.config import config_from_dict, config_to_dict, load_config, save_config
from attnkit.models.transformer import DecoderLayer, EncoderLayer, TransformerEncoder


def test_small_demo_config_has_1_054_696_parameters_without_embeddings():
    model = TransformerEncoderDecoder(preset("transformer-small"))
    core = count_parameters(model.encoder) + count_parameters(model.decoder) + count_parameters(model.generator)
    assert core == 1_054_696
    assert count_parameters(model) == core + 2 * 1000 * 128  # plus source and target embeddings


@pytest.mark.slow
def test_base_config_counts_and_shared_embeddings_are_tied():
    model = TransformerEncoderDecoder(preset("transformer-base"))
    per_encoder_layer = 4 * (512 * 512 + 512) + (512 * 2048 + 2048 + 2048 * 512 + 512) + 2 * 2 * 512
    assert count_parameters(model.encoder) == 6 * per_encoder_layer == 18_914_304
    assert model.generator.weight is model.source_embedding.tokens.weight is model.target_embedding.tokens.weight
    assert count_parameters(model) == 63_119_496  # ~65M in Vaswani et al., table 3 (vocabulary 37000)


def _copy_attention(ours, theirs: nn.MultiheadAttention) -> None:
    q, k, v = theirs.in_proj_weight.chunk(3)
    bq, bk, bv = theirs.in_proj_bias.chunk(3)
    for proj, w, b in ((ours.q_proj, q, bq), (ours.k_proj, k, bk), (ours.v_proj, v, bv)):
        proj.weight.data.copy_(w)
        proj.bias.data.copy_(b)
    ours.out_proj.weight.data.copy_(theirs.out_proj.weight)
    ours.out_proj.bias.data.copy_(theirs.out_proj.bias)


def _copy_common(ours, theirs) -> None:
    ours.feed_forward.linear1.load_state_dict(theirs.linear1.state_dict())
    ours.feed_forward.linear2.load_state_dict(theirs.linear2.state_dict())


def _copy_encoder_layer(ours: EncoderLayer, theirs: nn.TransformerEncoderLayer) -> None:
    _copy_attention(ours.self_attn, theirs.self_attn)
    _copy_common(ours, theirs)
    ours.attn_norm.load_state_dict(theirs.norm1.state_dict())
    ours.ff_norm.load_state_dict(theirs.norm2.state_dict())


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_encoder_stack_equals_torch_nn_transformer_encoder(rng, norm):
    config = TransformerConfig(50, 50, d_model=24, num_heads=4, d_ff=40, encoder_layers=3, dropout=0.0, norm=norm)
    ours = TransformerEncoder(config).double().eval()
    layer = nn.TransformerEncoderLayer(24, 4, 40, dropout=0.0, batch_first=True, norm_first=norm == "pre")
    final = nn.LayerNorm(24) if norm == "pre" else None
    theirs = nn.TransformerEncoder(layer, 3, norm=final, enable_nested_tensor=False).double().eval()
    for p in theirs.parameters():
        nn.init.normal_(p, generator=rng)
    for a, b in zip(ours.layers, theirs.layers):
        _copy_encoder_layer(a, b)
    if final is not None:
        ours.norm.load_state_dict(theirs.norm.state_dict())
    x = torch.randn(2, 11, 24, dtype=torch.float64, generator=rng)
    lengths = torch.tensor([11, 6])
    keep = torch.arange(11) < lengths[:, None]  # (B, S) True at real tokens
    expected = theirs(x, src_key_padding_mask=~keep)
    got = ours(x, keep[:, None, None, :])
    torch.testing.assert_close(got[0], expected[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got[1, :6], expected[1, :6], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_decoder_layer_equals_torch_nn_transformer_decoder_layer(rng, norm):
    ours = DecoderLayer(24, 4, 40, norm_first=norm == "pre").double().eval()
    theirs = nn.TransformerDecoderLayer(24, 4, 40, dropout=0.0, batch_first=True, norm_first=norm == "pre").double().eval()
    for p in theirs.parameters():
        nn.init.normal_(p, generator=rng)
    _copy_attention(ours.self_attn, theirs.self_attn)
    _copy_attention(ours.cross_attn, theirs.multihead_attn)
    _copy_common(ours, theirs)
    for ours_norm, norm_layer in ((ours.self_norm, theirs.norm1), (ours.cross_norm, theirs.norm2), (ours.ff_norm, theirs.norm3)):
        ours_norm.load_state_dict(norm_layer.state_dict())
    x = torch.randn(2, 7, 24, dtype=torch.float64, generator=rng)
    memory = torch.randn(2, 9, 24, dtype=torch.float64, generator=rng)
    keep = torch.arange(9) < torch.tensor([9, 5])[:, None]
    expected = theirs(x, memory, tgt_mask=nn.Transformer.generate_square_subsequent_mask(7, dtype=torch.float64),
                      memory_key_padding_mask=~keep, tgt_is_causal=True)
    got, _ = ours(x, memory, keep[:, None, None, :])
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_cached_incremental_decoding_equals_full_forward(rng, norm, positional):
    torch.manual_seed(0)
    config = TransformerConfig(30, 40, d_model=16, num_heads=4, d_ff=32, encoder_layers=2, decoder_layers=2,
                               dropout=0.0, norm=norm, positional=positional, max_len=64)
    model = TransformerEncoderDecoder(config).double().eval()
    source = torch.randint(4, 30, (3, 8), generator=rng)
    lengths = torch.tensor([8, 3, 5])
    target_in = torch.randint(4, 40, (3, 6), generator=rng)
    full = model(source, lengths, target_in, need_weights=True)
    state = model.encode(source, lengths)
    for t in range(6):
        step = model.step(state, target_in[:, t])
        torch.testing.assert_close(step.logits, full.logits[:, t], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(step.weights, full.weights[:, t], rtol=1e-10, atol=1e-10)
    assert torch.all(full.weights[1, :, 3:] == 0)
    # Changing a later target token leaves earlier logits unchanged (causal decoder).
    changed = target_in.clone()
    changed[:, 4] = (changed[:, 4] + 1) % 40
    torch.testing.assert_close(model(source, lengths, changed).logits[:, :4], full.logits[:, :4])


def test_config_validation_and_json_round_trip(tmp_path):
    config = preset("transformer-small", norm="pre")
    save_config(config, tmp_path / "config.json")
    assert load_config(tmp_path / "config.json") == config
    assert config_from_dict(json.loads(json.dumps(config_to_dict(config)))) == config
    with pytest.raises(ValueError, match="divisible by num_heads"):
        TransformerConfig(10, 10, d_model=30, num_heads=4)
    with pytest.raises(ValueError, match="share_embeddings needs one vocabulary"):
        TransformerConfig(10, 12, share_embeddings=True)
    with pytest.raises(ValueError, match=r"unknown TransformerConfig fields \['heads'\]"):
        config_from_dict({"kind": "transformer", "source_vocab": 5, "target_vocab": 5, "heads": 3})
    with pytest.raises(ValueError, match="unknown preset"):
        preset("gpt-5")
    with pytest.raises(AttributeError):
        config.d_model = 3  # frozen
