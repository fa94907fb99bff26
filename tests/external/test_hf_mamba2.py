"""attnkit's Mamba-2 mixer (``attnkit.layers.Mamba2``) against transformers' ``Mamba2Mixer`` (its torch path, the one
it runs without the CUDA kernels) with copied weights: the same outputs on a batch as it is and left-padded
(float32 to its rounding; float64 to 1e-10 with transformers' float32 steps kept in float64), gradients, and
attnkit's own promises: decoding token by token and in chunks equals one pass, the implicit attention matrix
reproduces the scan."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer  # noqa: E402

from attnkit.layers import LinearStateCache, Mamba2  # noqa: E402

from float64_checks import float64_inside  # noqa: E402

SIZES = dict(hidden_size=32, num_heads=4, head_dim=16, state_size=8, n_groups=2, expand=2, conv_kernel=4,
             chunk_size=8, num_hidden_layers=1, use_conv_bias=True, use_bias=False)


def _pair(dtype=torch.float32, **overrides):
    config = transformers.Mamba2Config(**(SIZES | overrides))
    torch.manual_seed(0)
    theirs = Mamba2Mixer(config, layer_idx=0).eval()
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if name not in ("A_log",):
                p.add_(0.2 * torch.randn_like(p))
    ours = Mamba2(config.hidden_size, config.num_heads, config.head_dim, config.state_size, n_groups=config.n_groups,
                  conv_kernel=config.conv_kernel, conv_bias=config.use_conv_bias, bias=config.use_bias,
                  norm_eps=config.layer_norm_epsilon, chunk_size=config.chunk_size,
                  dt_limit=tuple(config.time_step_limit))
    ours.load_state_dict(theirs.state_dict())
    return theirs.to(dtype), ours.to(dtype).eval()


@pytest.mark.parametrize("padded", [False, True], ids=["plain", "left-padded"])
def test_the_mixer_equals_transformers_in_float32(padded):
    theirs, ours = _pair()
    x = torch.randn(2, 19, 32, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 19, dtype=torch.long)
    if padded:
        mask[1, :5] = 0
    with torch.no_grad():
        want = theirs(x, attention_mask=mask if padded else None)
        got = ours(x, key_mask=mask.bool() if padded else None).output
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], rtol=2e-4, atol=2e-4)


def test_float64_equals_transformers_to_1e_10_with_its_float32_steps_in_float64():
    theirs, ours = _pair(torch.float64)
    x = torch.randn(2, 21, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 21, dtype=torch.long)
    mask[1, :4] = 0
    with torch.no_grad(), float64_inside():
        want = theirs(x, attention_mask=mask)
    got = ours(x, key_mask=mask.bool()).output
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], rtol=1e-10, atol=1e-10)


def test_gradients_equal_transformers():
    theirs, ours = _pair(torch.float64)
    x = torch.randn(2, 13, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with float64_inside():
        theirs(x).square().sum().backward()
    ours(x).output.square().sum().backward()
    grads = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-8, atol=1e-9, msg=name)


def test_decoding_token_by_token_and_in_chunks_equals_one_pass():
    _, ours = _pair(torch.float64)
    x = torch.randn(2, 17, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        whole = ours(x).output
        cache, pieces, start = LinearStateCache(), [], 0
        for size in (5, 1, 1, 7, 3):
            pieces.append(ours(x[:, start:start + size], cache=cache).output)
            start += size
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, rtol=1e-10, atol=1e-10)
    assert cache.position == 17 and cache.numbers() == 3 * ours.conv_dim + 4 * 8 * 16


def test_need_weights_returns_the_implicit_attention_matrix():
    _, ours = _pair(torch.float64)
    x = torch.randn(1, 11, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    result = ours(x, need_weights=True)
    assert result.weights.shape == (1, 4, 11, 11) and (result.weights.triu(1) == 0).all()


def test_with_a_projection_bias_a_left_padded_row_equals_its_prompt_alone_where_transformers_does_not():
    """use_bias=True: a padded token projects to in_proj's bias. attnkit zeroes a padded token's convolution input,
    so the row's real tokens give what the prompt alone gives (docs/linear.md); transformers convolves the bias of
    the padded tokens into the first real ones."""
    theirs, ours = _pair(torch.float64, use_bias=True)
    x = torch.randn(2, 15, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    mask = torch.ones(2, 15, dtype=torch.long)
    mask[1, :5] = 0
    with torch.no_grad(), float64_inside():
        padded = ours(x, key_mask=mask.bool()).output[1, 5:]
        alone = ours(x[1:, 5:]).output[0]
        theirs_padded = theirs(x, attention_mask=mask)[1, 5:]
        theirs_alone = theirs(x[1:, 5:])[0]
    torch.testing.assert_close(padded, alone, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(alone, theirs_alone, rtol=1e-10, atol=1e-10)
    assert (theirs_padded - theirs_alone)[:3].abs().max() > 1e-3  # the bias carried into the first real tokens
