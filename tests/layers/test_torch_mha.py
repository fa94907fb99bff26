"""nn.MultiheadAttention both ways: weights copied from and to torch's module, and the
drop-in TorchMultiheadAttention called as torch's is, equal to torch's module in training (dropout 0)
and eval, forward and backward, with torch's masks, batch_first both ways and unbatched inputs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnkit.layers import MultiHeadAttention, TorchMultiheadAttention, from_torch_mha, to_torch_mha

D, H, N, L, S = 32, 4, 3, 5, 7


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _torch_module(batch_first, kdim=None, vdim=None, bias=True, seed=0):
    torch.manual_seed(seed)
    module = nn.MultiheadAttention(D, H, bias=bias, kdim=kdim, vdim=vdim, batch_first=batch_first).double()
    with torch.no_grad():  # torch zeroes its biases at init: give them values a copy could miss
        for name, p in module.named_parameters():
            if "bias" in name:
                p.normal_()
    return module


def _inputs(batch_first, kdim=D, vdim=D, unbatched=False):
    shapes = [(L, D), (S, kdim), (S, vdim)]
    xs = [_rand(*shape, seed=i) if unbatched else _rand(N, *shape, seed=i) for i, shape in enumerate(shapes)]
    return xs if batch_first or unbatched else [x.transpose(0, 1).contiguous() for x in xs]


def _masks():
    padding = torch.zeros(N, S, dtype=torch.bool)
    padding[0, -2:] = True  # True = ignore, torch's convention
    causal_like = torch.ones(L, S, dtype=torch.bool).triu(1)  # True = not allowed
    per_head = _rand(N * H, L, S, seed=7) > 1.2
    per_head[..., 0] = False  # every row keeps a key (torch gives NaN for a row with none)
    yield "none", {}
    yield "key_padding_mask", {"key_padding_mask": padding}
    yield "float key_padding_mask", {"key_padding_mask": padding.double() * -5.0}
    yield "attn_mask (L, S)", {"attn_mask": causal_like}
    yield "attn_mask float", {"attn_mask": _rand(L, S, seed=8)}
    yield "attn_mask (N H, L, S) and padding", {"attn_mask": per_head, "key_padding_mask": padding}
    yield "causal hint", {"attn_mask": causal_like, "is_causal": True}


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_drop_in_equals_torchs_module_with_each_mask(batch_first, mode):
    theirs = _torch_module(batch_first)
    ours = TorchMultiheadAttention.from_torch(theirs)
    theirs.train(mode == "train"), ours.train(mode == "train")
    q, k, v = _inputs(batch_first)
    for label, masks in _masks():
        for average in (True, False):
            expected = theirs(q, k, v, average_attn_weights=average, **masks)
            got = ours(q, k, v, average_attn_weights=average, **masks)
            torch.testing.assert_close(got[0], expected[0], msg=label)
            torch.testing.assert_close(got[1], expected[1], msg=f"{label} weights")
        assert ours(q, k, v, need_weights=False, **masks)[1] is None


def test_drop_in_trains_as_torchs_module():
    theirs = _torch_module(True).train()
    ours = TorchMultiheadAttention.from_torch(theirs).train()
    q, k, v = _inputs(True)
    mask = torch.ones(L, S, dtype=torch.bool).triu(1)
    theirs(q, k, v, attn_mask=mask)[0].square().sum().backward()
    ours(q, k, v, attn_mask=mask)[0].square().sum().backward()
    grads = dict(theirs.named_parameters())
    for name, parameter in ours.named_parameters():  # torch's names, torch's gradients
        torch.testing.assert_close(parameter.grad, grads[name].grad, msg=name)


def test_unbatched_inputs_and_separate_projections():
    theirs = _torch_module(False, kdim=24, vdim=20).eval()
    ours = TorchMultiheadAttention.from_torch(theirs).eval()
    q, k, v = _inputs(False, 24, 20, unbatched=True)
    expected, got = theirs(q, k, v), ours(q, k, v)
    assert got[0].shape == (L, D) and got[1].shape == (L, S)
    torch.testing.assert_close(got, expected)


def test_load_state_dict_takes_torchs_keys_and_constructor_takes_torchs_arguments():
    theirs = _torch_module(True, kdim=24, vdim=20)
    ours = TorchMultiheadAttention(D, H, kdim=24, vdim=20, batch_first=True, dtype=torch.float64)
    ours.load_state_dict(theirs.state_dict())
    q, k, v = _inputs(True, 24, 20)
    torch.testing.assert_close(ours.eval()(q, k, v), theirs.eval()(q, k, v))
    packed = _torch_module(True, seed=1)
    same = TorchMultiheadAttention(D, H, batch_first=True, dtype=torch.float64)
    same.load_state_dict(packed.state_dict())
    q, k, v = _inputs(True)
    torch.testing.assert_close(same.eval()(q, k, v), packed.eval()(q, k, v))


@pytest.mark.parametrize("bias", [True, False])
def test_multi_head_attention_from_and_to_torch(bias):
    theirs = _torch_module(True, bias=bias).eval()
    layer = from_torch_mha(theirs)
    q, k, v = _inputs(True)
    expected = theirs(q, k, v, average_attn_weights=False)
    result = layer(q, k, v, need_weights=True)
    torch.testing.assert_close((result.output, result.weights), expected)
    back = to_torch_mha(layer, batch_first=False).eval()
    torch.testing.assert_close(back(*(x.transpose(0, 1) for x in (q, k, v)))[0].transpose(0, 1), expected[0])


def test_what_torchs_module_cannot_hold_is_named():
    with pytest.raises(ValueError, match="add_bias_kv"):
        from_torch_mha(nn.MultiheadAttention(D, H, add_bias_kv=True))
    with pytest.raises(ValueError, match="add_zero_attn"):
        from_torch_mha(nn.MultiheadAttention(D, H, add_zero_attn=True))
    with pytest.raises(ValueError, match="add_bias_kv"):
        TorchMultiheadAttention(D, H, add_bias_kv=True).to_attnkit()
    with pytest.raises(ValueError, match="num_kv_heads=2"):
        to_torch_mha(MultiHeadAttention(D, H, num_kv_heads=2))
    layer = TorchMultiheadAttention(D, H)
    with pytest.raises(ValueError, match="is_causal=True is a hint"):
        layer(*(torch.randn(L, N, D) for _ in range(3)), is_causal=True)
    with pytest.raises(ValueError, match=r"attn_mask must have shape \(5, 7\) or \(12, 5, 7\)"):
        layer(torch.randn(L, N, D), torch.randn(S, N, D), torch.randn(S, N, D), attn_mask=torch.ones(4, 5, 7).bool())


def test_documented_difference_a_fully_masked_row_is_zero_where_torch_gives_nan():
    theirs = _torch_module(True).eval()
    ours = TorchMultiheadAttention.from_torch(theirs).eval()
    q, k, v = _inputs(True)
    mask = torch.zeros(L, S, dtype=torch.bool)
    mask[2] = True  # row 2 may attend nothing
    expected, got = theirs(q, k, v, attn_mask=mask), ours(q, k, v, attn_mask=mask)
    assert torch.isnan(expected[0][:, 2]).all()
    # the output projection's bias is what a zero context gives
    torch.testing.assert_close(got[0][:, 2], ours.out_proj.bias.expand(N, D))
    keep = torch.arange(L) != 2
    torch.testing.assert_close(got[0][:, keep], expected[0][:, keep])


@pytest.mark.parametrize("extras", [{}, {"add_bias_kv": True}, {"add_zero_attn": True}, {"kdim": 24, "vdim": 20}])
def test_the_state_dict_is_torchs_both_ways_and_the_same_seed_gives_the_same_weights(extras):
    """A model that swapped the drop-in in saves a checkpoint that loads strictly into the same model with
    nn.MultiheadAttention, and back."""
    torch.manual_seed(3)
    theirs = nn.MultiheadAttention(D, H, batch_first=True, dtype=torch.float64, **extras)
    torch.manual_seed(3)
    ours = TorchMultiheadAttention(D, H, batch_first=True, dtype=torch.float64, **extras)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for (name, a), b in zip(ours.state_dict().items(), theirs.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    fresh = nn.MultiheadAttention(D, H, batch_first=True, dtype=torch.float64, **extras)
    fresh.load_state_dict(ours.state_dict(), strict=True)
    again = TorchMultiheadAttention(D, H, batch_first=True, dtype=torch.float64, **extras)
    again.load_state_dict(theirs.state_dict(), strict=True)
    kdim, vdim = extras.get("kdim", D), extras.get("vdim", D)
    q, k, v = _inputs(True, kdim, vdim)
    torch.testing.assert_close(again.eval()(q, k, v), theirs.eval()(q, k, v))
    assert ours.in_proj_weight is None if "kdim" in extras else ours.in_proj_weight.shape == (3 * D, D)
