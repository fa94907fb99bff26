"""Today's linear-attention layers against transformers' own modules with copied weights: Qwen3-Next's
``Qwen3NextGatedDeltaNet`` and attnkit's :class:`~attnkit.layers.GatedDeltaNet` give the same output for a whole
pass, left-padded batches, token-by-token and chunked decoding through the constant-size cache, and the same
gradients; so do Kimi Delta Attention and MiniMax's lightning attention. transformers computes the rule in float32
whatever the model's dtype: in float32 the comparison is to its rounding, and in float64, with those steps kept in
float64 (float64_checks), to 1e-10; attnkit's own float64 exactness is tests/functional/test_delta_rule.py's."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers.models.qwen3_next import modeling_qwen3_next as qn  # noqa: E402

from attnkit.layers import GatedDeltaNet, LinearStateCache  # noqa: E402
from attnkit.layers.delta import causal_convolution  # noqa: E402

from float64_checks import float64_copy, float64_inside  # noqa: E402

SIZES = dict(hidden_size=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
             linear_value_head_dim=6, linear_conv_kernel_dim=4)


def _pair():
    config = transformers.Qwen3NextConfig(**SIZES, num_hidden_layers=1, layer_types=["linear_attention"],
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=50)
    torch.manual_seed(0)
    theirs = qn.Qwen3NextGatedDeltaNet(config, 0).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0.0, 0.3)
        theirs.A_log.uniform_(-2.0, 1.0)
    ours = GatedDeltaNet(32, 2, 4, 8, 6, conv_kernel=4, norm_eps=config.rms_norm_eps).eval()
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def test_a_whole_pass_and_a_left_padded_batch_equal_transformers():
    theirs, ours = _pair()
    x = torch.randn(2, 29, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(x).output, theirs(x), rtol=2e-4, atol=2e-4)
        mask = torch.ones(2, 29, dtype=torch.long)
        mask[1, :6] = 0
        got, want = ours(x, key_mask=mask.bool()).output, theirs(x, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("steps", [[1] * 17, [5, 1, 7, 4]], ids=["token-by-token", "chunks"])
def test_decoding_through_the_constant_size_cache_equals_the_whole_pass(steps):
    theirs, ours = _pair()
    x = torch.randn(2, 17, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = theirs(x)
        cache, outputs, start = LinearStateCache(), [], 0
        for size in steps:
            outputs.append(ours(x[:, start:start + size], cache=cache).output)
            start += size
            held = cache.numbers()
        assert held == (4 - 1) * ours.conv_dim + 4 * 8 * 6 and cache.position == 17  # whatever the length
    torch.testing.assert_close(torch.cat(outputs, dim=1), want, rtol=2e-4, atol=2e-4)


def test_gradients_equal_transformers():
    theirs, ours = _pair()
    x = torch.randn(2, 19, 32, generator=torch.Generator().manual_seed(3))
    theirs(x).square().sum().backward()
    ours(x).output.square().sum().backward()
    grads = dict(theirs.named_parameters())
    for name, parameter in ours.named_parameters():
        torch.testing.assert_close(parameter.grad, grads[name].grad, rtol=1e-3, atol=1e-3, msg=name)


def test_the_implicit_attention_of_the_layer_reproduces_its_heads():
    """need_weights gives each value head's (L, L) matrix: applied to the convolved values it gives the
    rule's output (before the gated norm), so the heatmaps and head roles read the layer."""
    _, ours = _pair()
    ours = ours.double()
    x = torch.randn(1, 12, 32, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    result = ours(x, need_weights=True)
    assert result.weights.shape == (1, 4, 12, 12) and (result.weights.triu(1) == 0).all()
    captured = {}
    real = ours.norm.forward
    ours.norm.forward = lambda h, z: captured.setdefault("core", h) is not None and real(h, z)
    ours(x)
    mixed = causal_convolution(torch.cat(ours._split(x)[:3], dim=-1).transpose(1, 2), ours.conv1d.weight, None).transpose(1, 2)
    v = mixed[..., -ours.value_dim:].reshape(1, 12, 4, 6).transpose(1, 2)
    torch.testing.assert_close(result.weights @ v, captured["core"].transpose(1, 2), rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------- Kimi Delta Attention
def _kimi_pair():
    from transformers.models.kimi_linear import modeling_kimi_linear as kl

    from attnkit.layers import KimiDeltaAttention

    config = transformers.KimiLinearConfig(hidden_size=32, linear_num_heads=4, linear_head_dim=8,
                                           linear_conv_kernel_dim=4, num_hidden_layers=1,
                                           layer_types=["linear_attention"], mlp_layer_types=["dense"],
                                           num_attention_heads=4, num_key_value_heads=4, vocab_size=50)
    torch.manual_seed(0)
    theirs = kl.KimiLinearDeltaAttention(config, 0).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0.0, 0.3)
        theirs.forget_gate.A_log.uniform_(-2.0, 0.5)
    ours = KimiDeltaAttention(32, 4, 8, conv_kernel=4, norm_eps=config.rms_norm_eps).eval()
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def test_kimi_delta_attention_equals_transformers_whole_padded_decoded_and_in_its_gradients():
    theirs, ours = _kimi_pair()
    x = torch.randn(2, 23, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = theirs(x)
        torch.testing.assert_close(ours(x).output, want, rtol=2e-4, atol=2e-4)
        mask = torch.ones(2, 23, dtype=torch.long)
        mask[1, :5] = 0
        got, padded = ours(x, key_mask=mask.bool()).output, theirs(x, attention_mask=mask)
        torch.testing.assert_close(got[mask.bool()], padded[mask.bool()], rtol=2e-4, atol=2e-4)
        cache, outputs = LinearStateCache(), []
        for start, size in ((0, 6), (6, 1), (7, 1), (8, 15)):
            outputs.append(ours(x[:, start:start + size], cache=cache).output)
        torch.testing.assert_close(torch.cat(outputs, dim=1), want, rtol=2e-4, atol=2e-4)
    theirs(x).square().sum().backward()
    ours(x).output.square().sum().backward()
    grads = dict(theirs.named_parameters())
    for name, parameter in ours.named_parameters():
        torch.testing.assert_close(parameter.grad, grads[name].grad, rtol=1e-3, atol=1e-3, msg=name)


# ----------------------------------------------------------------------------- MiniMax's lightning attention
def _lightning_pair(layer_idx=1):
    from transformers.models.minimax import modeling_minimax as mm

    from attnkit.layers import LightningAttention

    config = transformers.MiniMaxConfig(hidden_size=32, num_attention_heads=4, head_dim=8, num_hidden_layers=3,
                                        block_size=8, layer_types=["linear_attention"] * 3, num_key_value_heads=4,
                                        vocab_size=50, intermediate_size=16, num_local_experts=2, num_experts_per_tok=1)
    torch.manual_seed(0)
    theirs = mm.MiniMaxLightningAttention(config, layer_idx).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0.0, 0.3)
    ours = LightningAttention(32, 4, 8, layer_idx=layer_idx, num_layers=3, block_size=8,
                              norm_eps=theirs.norm.variance_epsilon).eval()
    ours.load_state_dict(theirs.state_dict())  # its buffers too: strictly
    return theirs, ours


def test_lightning_attention_equals_minimaxs_whole_padded_decoded_and_in_its_gradients():
    theirs, ours = _lightning_pair()
    x = torch.randn(2, 21, 32, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        want = theirs(x, None, None)[0]
        torch.testing.assert_close(ours(x).output, want, rtol=2e-4, atol=2e-4)
        mask = torch.ones(2, 21, dtype=torch.long)
        mask[1, :4] = 0
        got, padded = ours(x, key_mask=mask.bool()).output, theirs(x, None, mask)[0]
        torch.testing.assert_close(got[mask.bool()], padded[mask.bool()], rtol=2e-4, atol=2e-4)
        cache, outputs = LinearStateCache(), []
        for start, size in ((0, 9), (9, 1), (10, 11)):
            outputs.append(ours(x[:, start:start + size], cache=cache).output)
        torch.testing.assert_close(torch.cat(outputs, dim=1), want, rtol=2e-4, atol=2e-4)
    theirs(x, None, None)[0].square().sum().backward()
    ours(x).output.square().sum().backward()
    grads = dict(theirs.named_parameters())
    for name, parameter in ours.named_parameters():
        torch.testing.assert_close(parameter.grad, grads[name].grad, rtol=1e-3, atol=1e-3, msg=name)


# ----------------------------------------------------------------------------- all three in float64
PAIRS = {  # layer: (its pair, transformers' call on (x, mask or None))
    "gated_deltanet": (_pair, lambda theirs, x, mask: theirs(x, attention_mask=mask)),
    "kimi_delta": (_kimi_pair, lambda theirs, x, mask: theirs(x, attention_mask=mask)),
    "lightning": (_lightning_pair, lambda theirs, x, mask: theirs(x, None, mask)[0]),
}


@pytest.mark.parametrize("layer", sorted(PAIRS))
def test_float64_equals_transformers_to_1e_10_whole_padded_and_in_its_gradients(layer):
    make, call = PAIRS[layer]
    theirs, ours = make()
    ours = ours.double()
    x = torch.randn(2, 21, 32, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    mask = torch.ones(2, 21, dtype=torch.long)
    mask[1, :5] = 0
    real = mask.bool()
    with torch.no_grad():
        got, got_padded = ours(x).output, ours(x, key_mask=real).output
    ours(x).output.square().sum().backward()
    with float64_inside():
        theirs = float64_copy(theirs)
        with torch.no_grad():
            want, want_padded = call(theirs, x, None), call(theirs, x, mask)
        call(theirs, x, None).square().sum().backward()
    assert got.dtype == want.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got_padded[real], want_padded[real], rtol=1e-10, atol=1e-10)
    grads = dict(theirs.named_parameters())
    for name, parameter in ours.named_parameters():
        torch.testing.assert_close(parameter.grad, grads[name].grad, rtol=1e-9, atol=1e-10, msg=name)
