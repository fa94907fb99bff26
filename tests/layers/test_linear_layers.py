"""The linear-attention layers' own promises on a call of no token (their equality with transformers' modules is
tests/external/test_hf_linear.py's): an empty output, and a cache left as it was."""

from __future__ import annotations

import pytest
import torch

from attnkit.layers import GatedDeltaNet, KimiDeltaAttention, LightningAttention, LinearStateCache
from attnkit.layers.delta import causal_convolution

from helpers import OpsSeen

LAYERS = {"gated_deltanet": lambda: GatedDeltaNet(32, 2, 4, 8, 6), "kimi": lambda: KimiDeltaAttention(32, 2, 8),
          "lightning": lambda: LightningAttention(32, 2, 8, layer_idx=0, num_layers=2)}


@pytest.mark.parametrize("name", LAYERS)
def test_a_call_of_no_token_gives_an_empty_output_and_leaves_the_cache_as_it_was(name):
    torch.manual_seed(0)
    layer = LAYERS[name]().eval()
    prompt, step, nothing = torch.randn(2, 5, 32), torch.randn(2, 1, 32), torch.randn(2, 0, 32)
    with torch.no_grad():
        assert layer(nothing).output.shape == (2, 0, 32)
        cache, straight = LinearStateCache(), LinearStateCache()
        layer(prompt, cache=cache)
        layer(prompt, cache=straight)
        assert layer(nothing, cache=cache).output.shape == (2, 0, 32)
        assert cache.position == 5 and torch.equal(cache.state, straight.state)
        assert (cache.conv is None) == (straight.conv is None) and (cache.conv is None or torch.equal(cache.conv, straight.conv))
        torch.testing.assert_close(layer(step, cache=cache).output, layer(step, cache=straight).output, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["gated_deltanet", "kimi"])
def test_a_decoding_step_waits_for_nothing_and_equals_the_whole_pass(name):
    """The delta-rule layers make their g and beta in range (a sigmoid; -exp(.) softplus(.)), so a decoding step
    through the cache looks at no value (no host wait: no scalar read), and prefill then steps equal one pass of
    the whole sequence (float64, to 1e-10)."""
    torch.manual_seed(0)
    layer = LAYERS[name]().double().eval()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    with torch.no_grad():
        whole = layer(x).output
        cache = LinearStateCache()
        pieces = [layer(x[:, :6], cache=cache).output]
        with OpsSeen() as ops:
            pieces.append(layer(x[:, 6:7], cache=cache).output)
        pieces += [layer(x[:, t:t + 1], cache=cache).output for t in (7, 8)]
    assert "aten._local_scalar_dense.default" not in ops.seen
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5), (torch.bfloat16, 1e-2)],
                         ids=str)
def test_a_decoding_steps_convolution_is_the_convolutions_last_output(dtype, tol):
    """causal_convolution on one new token (its taps multiplied and summed, in float32 for a half type) gives what
    F.conv1d gives at that position of the whole sequence, and keeps the same last inputs in the cache."""
    torch.manual_seed(0)
    weight = torch.randn(12, 1, 4, dtype=torch.float64).to(dtype)
    mixed = torch.randn(2, 12, 7, dtype=torch.float64).to(dtype)
    whole = causal_convolution(mixed, weight, None)
    cache = LinearStateCache()
    steps = [causal_convolution(mixed[..., :5], weight, cache)]
    steps += [causal_convolution(mixed[..., t:t + 1], weight, cache) for t in (5, 6)]
    torch.testing.assert_close(torch.cat(steps, dim=-1), whole, rtol=tol, atol=tol)
    torch.testing.assert_close(cache.conv, mixed[..., -3:], rtol=0, atol=0)


@pytest.mark.parametrize("name", LAYERS)
def test_a_fresh_layer_trains_in_float32_with_finite_gradients(name):
    """A freshly initialised layer at training length (float32, L = 128, chunks of 64): every parameter's gradient
    is finite (per-head decays whose chunk total passed float32's exp range gave NaN in A_log, dt_bias and
    in_proj_ba)."""
    torch.manual_seed(0)
    layer = LAYERS[name]()
    x = torch.randn(2, 128, 32)
    layer(x).output.square().mean().backward()
    for parameter_name, parameter in layer.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), parameter_name


@pytest.mark.parametrize("name", LAYERS)
def test_a_padded_tokens_nan_reaches_no_real_token_and_the_cache_counts_its_numbers(name):
    """Left padding whose input holds NaN and inf: the real tokens' outputs equal the unpadded row's (the padded
    input is selected away before the convolution, not multiplied by 0); the cache counts what it holds per
    sequence (the state, and the convolution's tail where the layer has one)."""
    torch.manual_seed(0)
    layer = LAYERS[name]().double().eval()
    x = torch.randn(1, 7, 32, dtype=torch.float64)
    padded = torch.cat([torch.full((1, 2, 32), float("nan"), dtype=torch.float64), x], dim=1)
    padded[0, 1] = float("inf")
    key_mask = torch.tensor([[False, False] + [True] * 7])
    with torch.no_grad():
        want = layer(x).output
        cache = LinearStateCache()
        got = layer(padded, key_mask=key_mask, cache=cache).output
    torch.testing.assert_close(got[:, 2:], want, rtol=1e-10, atol=1e-10)
    expected = cache.state[0].numel() + (0 if cache.conv is None else cache.conv[0].numel())
    assert cache.numbers() == expected > 0
