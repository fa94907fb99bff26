"""SDPA's vocabulary: ``attnkit.attention`` takes torch's keyword names with torch's
meaning, ``attnkit.scaled_dot_product_attention`` is F.scaled_dot_product_attention's drop-in (same
numbers on torch's own kinds of test shapes, forward and backward), and a wrong keyword names the
right one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnkit


def _rand(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


SHAPES = {  # name -> (query, key, value) shapes, as torch's tests vary them
    "4-D": ((2, 4, 7, 8), (2, 4, 9, 8), (2, 4, 9, 8)),
    "value dim": ((2, 4, 7, 8), (2, 4, 9, 8), (2, 4, 9, 5)),
    "3-D": ((3, 7, 8), (3, 9, 8), (3, 9, 8)),
    "2-D": ((7, 8), (9, 8), (9, 8)),
    "5-D": ((2, 3, 4, 7, 8), (2, 3, 4, 9, 8), (2, 3, 4, 9, 8)),
}


def _inputs(name, dtype=torch.float64, grad=False):
    return [_rand(*shape, dtype=dtype, seed=i).requires_grad_(grad) for i, shape in enumerate(SHAPES[name])]


def _masks(q_shape, S, dtype):
    L = q_shape[-2]
    lead = q_shape[:-2]
    boolean = _rand(*lead, L, S, seed=9) > -0.5
    yield "bool (L, S)", boolean.reshape(-1, L, S)[0]
    yield "bool full", boolean
    yield "float (L, S)", _rand(L, S, dtype=dtype, seed=10)
    yield "float per example", _rand(*lead[:-1], 1, L, S, dtype=dtype, seed=11) if len(lead) >= 2 else _rand(L, S, dtype=dtype, seed=11)
    yield "bool keys only (1, S)", boolean.reshape(-1, L, S)[0, :1]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_drop_in_equals_torchs_sdpa_with_each_kind_of_mask(shape):
    q, k, v = _inputs(shape)
    for label, mask in _masks(q.shape, k.shape[-2], q.dtype):
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        got = attnkit.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert type(got) is torch.Tensor and got.shape == expected.shape, label
        torch.testing.assert_close(got, expected, msg=label)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_drop_in_equals_torchs_sdpa_causal_scaled_gqa_and_in_gradients(dtype):
    q = _rand(2, 8, 7, 16, dtype=dtype).requires_grad_()
    k, v = (_rand(2, 2, 9, 16, dtype=dtype, seed=s).requires_grad_() for s in (1, 2))
    tolerance = dict(atol=1e-12, rtol=1e-12) if dtype == torch.float64 else dict(atol=2e-6, rtol=2e-5)
    for options in (dict(is_causal=True), dict(scale=0.3), dict(is_causal=True, scale=2.0)):
        expected = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **options)
        got = attnkit.scaled_dot_product_attention(q, k, v, enable_gqa=True, **options)
        torch.testing.assert_close(got, expected, **tolerance)
        want = torch.autograd.grad(expected.square().sum(), (q, k, v))
        have = torch.autograd.grad(got.square().sum(), (q, k, v))
        for a, b in zip(have, want):
            torch.testing.assert_close(a, b, **tolerance)


def test_drop_in_refuses_what_torch_refuses_by_name():
    q, k, v = _rand(2, 8, 7, 16), _rand(2, 2, 9, 16), _rand(2, 2, 9, 16)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        attnkit.scaled_dot_product_attention(q, k, v)
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, k, v)  # torch refuses it too
    q, k, v = _inputs("4-D")
    with pytest.raises(ValueError, match="attn_mask and is_causal"):
        attnkit.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(7, 9, dtype=torch.bool), is_causal=True)
    with pytest.raises(ValueError, match="attn_mask of shape"):
        attnkit.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(3, 7, 9, dtype=torch.bool))
    with pytest.raises(TypeError, match="scale"):
        attnkit.scaled_dot_product_attention(q, k, v, None, 0.0, False, 0.5)  # keyword-only, as torch's


TORCH_VERSION = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])


@pytest.mark.parametrize("shapes", [((0, 4, 8), (0, 6, 8)), ((2, 0, 4, 8), (2, 0, 6, 8)), ((0, 2, 4, 8), (0, 2, 6, 8)),
                                    ((2, 3, 0, 8), (2, 3, 6, 8))], ids=["3-D batch 0", "no heads", "batch 0", "no queries"])
def test_drop_in_returns_torchs_empty_result_where_there_is_nothing_to_attend(shapes):
    q = _rand(*shapes[0]).requires_grad_()
    k, v = _rand(*shapes[1], seed=1), _rand(*shapes[1], seed=2)
    got = attnkit.scaled_dot_product_attention(q, k, v)
    assert got.shape == (*q.shape[:-1], v.shape[-1]) and got.requires_grad
    if q.shape[-3] or TORCH_VERSION >= (2, 13):  # torch 2.11's CPU SDPA dies of a floating-point exception there
        assert got.shape == F.scaled_dot_product_attention(q, k, v).shape
    got.sum().backward()
    assert q.grad is not None and q.grad.shape == q.shape


def test_documented_difference_a_row_with_no_key_is_zero_not_nan():
    q, k, v = _inputs("4-D")
    mask = torch.ones(7, 9, dtype=torch.bool)
    mask[3] = False
    got = attnkit.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(got[..., 3, :], torch.zeros_like(got[..., 3, :]))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    keep = torch.arange(7) != 3
    torch.testing.assert_close(got[..., keep, :], expected[..., keep, :])


def test_attention_takes_sdpas_names_with_sdpas_meaning():
    q, k, v = _inputs("4-D")
    boolean = _rand(7, 9, seed=3) > 0
    additive = _rand(2, 1, 7, 9, seed=4)
    torch.testing.assert_close(attnkit.attention(q, k, v, attn_mask=boolean).output,
                               attnkit.attention(q, k, v, mask=boolean).output)
    torch.testing.assert_close(attnkit.attention(q, k, v, attn_mask=additive).output,
                               F.scaled_dot_product_attention(q, k, v, attn_mask=additive))
    with pytest.raises(ValueError, match="attn_mask .boolean. and mask"):
        attnkit.attention(q, k, v, attn_mask=boolean, mask=boolean)
    with pytest.raises(ValueError, match="attn_mask .float. and bias"):
        attnkit.attention(q, k, v, attn_mask=additive, bias=additive)
    gq, gk, gv = _rand(2, 8, 7, 16), _rand(2, 2, 9, 16), _rand(2, 2, 9, 16)
    torch.testing.assert_close(attnkit.attention(gq, gk, gv, enable_gqa=True).output,
                               F.scaled_dot_product_attention(gq, gk, gv, enable_gqa=True))
    with pytest.raises(ValueError, match="enable_gqa=False, but q has 8 heads and k 2"):
        attnkit.attention(gq, gk, gv, enable_gqa=False)


@pytest.mark.parametrize("backend", ["auto", "tiled", "reference"])
def test_return_lse_returns_the_log_sum_exp_whatever_the_backend(backend):
    q, k, v = _inputs("4-D")
    result = attnkit.attention(q, k, v, is_causal=True, return_lse=True, backend=backend)
    scores = (q @ k.transpose(-1, -2) / 8**0.5).masked_fill(~torch.ones(7, 9, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(result.lse, torch.logsumexp(scores, -1))
    torch.testing.assert_close(result.output, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert attnkit.attention(q, k, v, backend=backend).lse is None or backend != "auto"


def test_return_lse_with_sdpa_is_refused_by_name():
    q, k, v = _inputs("4-D")
    with pytest.raises(ValueError, match="backend='sdpa' returns no log-sum-exp"):
        attnkit.attention(q, k, v, return_lse=True, backend="sdpa")


@pytest.mark.parametrize(("wrong", "hint"), [
    ("key_padding_mask", "from_key_padding_mask"),
    ("causal", "is_causal="),
    ("softmax_scale", "scale="),
    ("return_aux", "return_lse=True"),
    ("need_weight", "need_weights="),
    ("dropout", "dropout_p="),
])
def test_a_wrong_keyword_names_the_right_one(wrong, hint):
    q, k, v = _inputs("4-D")
    with pytest.raises(TypeError, match="did you mean") as error:
        attnkit.attention(q, k, v, **{wrong: None})
    assert hint in str(error.value) and repr(wrong) in str(error.value)


@pytest.mark.parametrize("variant", ["upper_left", "lower_right"])
@pytest.mark.parametrize("L, S", [(7, 9), (6, 6), (9, 4)], ids=str)
@pytest.mark.parametrize("shape", ["4-D", "3-D", "grouped"])
def test_torchs_causal_bias_is_a_causal_call_aligned_as_it_says(variant, L, S, shape):
    """torch.nn.attention.bias's causal_upper_left / causal_lower_right as attn_mask: torch's numbers (forward and
    the gradients of q, k and v) from the drop-in and from attention(), on every row that has a key; a row with none
    (lower-right, L > S) is zeros, attnkit's rule, where torch's math kernel gives NaN."""
    from torch.nn.attention import bias as torch_bias

    causal_bias = getattr(torch_bias, f"causal_{variant}")(L, S)
    lead = {"4-D": (2, 4), "3-D": (3,), "grouped": (2, 4)}[shape]
    heads = (2, 2) if shape == "grouped" else lead
    q = _rand(*lead, L, 8, seed=1).requires_grad_()
    k, v = (_rand(*heads, S, 8, seed=s).requires_grad_() for s in (2, 3))
    grouped = dict(enable_gqa=True) if shape == "grouped" else {}
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_bias, **grouped)
    rows = want.isfinite().all(-1)
    theirs = torch.autograd.grad(want[rows].sum(), (q, k, v))
    for got in (attnkit.scaled_dot_product_attention(q, k, v, attn_mask=causal_bias, **grouped),
                attnkit.attention(q, k, v, attn_mask=causal_bias).output if q.dim() == 4 else None):
        if got is None:
            continue
        torch.testing.assert_close(got[rows], want[rows], rtol=1e-10, atol=1e-10)
        assert (got[~rows] == 0).all()
        for mine, torchs in zip(torch.autograd.grad(got[rows].sum(), (q, k, v)), theirs):
            torch.testing.assert_close(mine, torchs, rtol=1e-10, atol=1e-10)


def test_a_causal_bias_beside_is_causal_another_alignment_or_other_lengths_is_refused_by_name():
    from torch.nn.attention.bias import causal_lower_right

    q, k, v = _inputs("4-D")  # L = 7, S = 9
    with pytest.raises(ValueError, match="pass one"):
        attnkit.attention(q, k, v, attn_mask=causal_lower_right(7, 9), is_causal=True)
    with pytest.raises(ValueError, match="pass one"):
        attnkit.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(7, 9), is_causal=True)
    with pytest.raises(ValueError, match=r"causal_align='top-left'|LOWER_RIGHT"):
        attnkit.attention(q, k, v, attn_mask=causal_lower_right(7, 9), causal_align="middle")
    for call in (attnkit.attention, attnkit.scaled_dot_product_attention):
        with pytest.raises(ValueError, match="CausalBias for L=7, S=8, but q has L=7 and k has S=9"):
            call(q, k, v, attn_mask=causal_lower_right(7, 8))
