"""Jagged nested q, k and v (torch.nested, layout=torch.jagged), as torch's SDPA takes them: attention() gives each
sequence what a dense call of that sequence alone gives (torch's own SDPA in float64, the causal mask and window
aligned within the sequence), with gradients, the NaN rule per sequence, q's offsets on the output, and torch's own
nested SDPA's numbers where it has a kernel; what it cannot take is refused by name."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnkit

LENGTHS = [3, 7, 1, 5]


def _jagged(lengths, H, E, dtype=torch.float64, generator=None):
    """A jagged leaf (B, j, H, E) of sequences of these lengths, requiring gradients, its (B, H, j, E) view as
    attention() takes it, and the sequences (L_b, H, E) as separate leaves."""
    parts = [torch.randn(n, H, E, dtype=dtype, generator=generator) for n in lengths]
    leaf = torch.nested.nested_tensor(parts, layout=torch.jagged, requires_grad=True)
    return leaf, leaf.transpose(1, 2), [p.clone().requires_grad_() for p in parts]


def _alone(q, k, v, is_causal, causal_align, window, scale=None, sinks=None):
    """One sequence (H, L, E) against its keys (Hkv, S, E), dense, with torch's SDPA in float64 (sinks as an extra
    key with a zero value)."""
    L, S = q.shape[1], k.shape[1]
    offset = S - L if causal_align == "bottom-right" else 0
    i, j = torch.arange(L)[:, None], torch.arange(S)
    allowed = torch.ones(L, S, dtype=torch.bool)
    if is_causal or window is not None:
        allowed = j <= i + offset
        if window is not None:
            allowed &= j > i + offset - window
    groups = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
    scores = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        scores = torch.cat([scores, sinks.view(-1, 1, 1).expand(-1, L, 1)], -1)
        v = torch.cat([v, v.new_zeros(v.shape[0], 1, v.shape[2])], 1)
    weights = torch.nan_to_num(torch.softmax(scores, -1), nan=0.0)
    return weights @ v


CASES = [
    dict(), dict(is_causal=True), dict(is_causal=True, causal_align="bottom-right"), dict(window=2),
    dict(window=3, causal_align="bottom-right"), dict(scale=0.3), dict(sinks=True), dict(backend="tiled"),
    dict(backend="reference", is_causal=True), dict(groups=2),
]


@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_each_sequence_gets_what_it_gets_alone(case, cross):
    """Every sequence's rows equal a dense float64 call of that sequence alone (cross: keys of other lengths than
    the queries), and the gradients of q, k and v match the dense calls' summed loss."""
    case = dict(case)
    generator = torch.Generator().manual_seed(len(str(case)) + cross)
    H, groups = 4, case.pop("groups", 1)
    key_lengths = [6, 2, 9, 5] if cross else LENGTHS
    (ql, q, qs), (kl, k, ks), (vl, v, vs) = (_jagged(n, h, e, generator=generator) for n, h, e in
                                             ((LENGTHS, H, 8), (key_lengths, H // groups, 8), (key_lengths, H // groups, 6)))
    sinks = torch.randn(H, dtype=torch.float64, generator=generator) if case.pop("sinks", False) else None
    out = attnkit.attention(q, k, v, sinks=sinks, **case).output
    assert out.is_nested and out.offsets() is q.offsets()  # q's sequences: out + q's own tensors add up
    alone = dict(is_causal=case.get("is_causal", False), causal_align=case.get("causal_align", "top-left"),
                 window=case.get("window"), scale=case.get("scale"), sinks=sinks)
    wants = [_alone(a.transpose(0, 1), b.transpose(0, 1), c.transpose(0, 1), **alone) for a, b, c in zip(qs, ks, vs)]
    for got, want in zip(out.unbind(), wants):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    grads = [torch.randn_like(w) for w in wants]
    torch.autograd.backward(wants, grads)
    flat = torch.cat([g.transpose(0, 1) for g in grads])  # (total, H, Ev) in q's order
    out.backward(torch.nested.nested_tensor_from_jagged(flat, offsets=q.offsets()).transpose(1, 2))
    for leaf, parts in ((ql, qs), (kl, ks), (vl, vs)):
        torch.testing.assert_close(leaf.grad.values(), torch.cat([p.grad for p in parts]), rtol=1e-10, atol=1e-10)


def test_torch_sdpa_on_the_same_nested_tensors_gives_the_same_numbers():
    """Where torch's own SDPA takes the nested tensors (not causal, on the CPU), the two agree, and attnkit's drop-in
    scaled_dot_product_attention takes them too, returning q's offsets as torch does."""
    generator = torch.Generator().manual_seed(5)
    (_, q, _), (_, k, _), (_, v, _) = (_jagged(n, 2, 8, dtype=torch.float32, generator=generator)
                                       for n in (LENGTHS, [4, 4, 2, 8], [4, 4, 2, 8]))
    want = F.scaled_dot_product_attention(q, k, v)
    for got in (attnkit.attention(q, k, v).output, attnkit.scaled_dot_product_attention(q, k, v)):
        assert got.offsets() is q.offsets()
        for a, b in zip(got.unbind(), want.unbind()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_nan_rule_holds_per_sequence():
    """A NaN in one sequence's key poisons every row of that sequence's head, and nothing of the other sequences;
    a NaN query poisons its own row."""
    generator = torch.Generator().manual_seed(9)
    qs, ks, vs = ([torch.randn(n, 2, 8, dtype=torch.float64, generator=generator) for n in LENGTHS] for _ in range(3))
    ks[1][2, 1, 0] = float("nan")  # sequence 1, its third key, head 1
    qs[2][0, 0, 3] = float("nan")  # sequence 2, its first query, head 0
    q, k, v = (torch.nested.nested_tensor(parts, layout=torch.jagged).transpose(1, 2) for parts in (qs, ks, vs))
    out = attnkit.attention(q, k, v, is_causal=True).output.unbind()
    assert out[1][1].isnan().all() and not out[1][0].isnan().any()
    assert out[2][0, 0].isnan().all() and not out[2][1].isnan().any()
    assert not out[0].isnan().any() and not out[3].isnan().any()


REFUSALS = {
    "mask": (dict(mask=torch.ones(4, 1, 9, 9, dtype=torch.bool)), ValueError, "mask= is not taken with nested"),
    "attn_mask": (dict(attn_mask=torch.ones(9, 9, dtype=torch.bool)), ValueError, "attn_mask= is not taken"),
    "bias": (dict(bias=torch.zeros(9, 9)), ValueError, "bias= is not taken with nested"),
    "weights": (dict(need_weights=True), ValueError, "need_weights= is not taken"),
    "lse": (dict(return_lse=True), ValueError, "return_lse= is not taken"),
    "window": (dict(window=0, causal_align="bottom-right"), ValueError, "window must be a positive int"),
    "alignment": (dict(is_causal=True, causal_align="middle"), ValueError, "causal_align must be one of"),
    "keyword": (dict(is_casual=True), TypeError, "is_causal"),
    "CausalBias": (dict(attn_mask="lower_right"), ValueError, "aligns the causal mask within each sequence"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_what_a_nested_call_cannot_take_is_named(case):
    kwargs, error, message = REFUSALS[case]
    if kwargs.get("attn_mask") == "lower_right":
        from torch.nn.attention.bias import causal_lower_right

        kwargs = dict(attn_mask=causal_lower_right(7, 7))
    (_, q, _), (_, k, _), (_, v, _) = (_jagged(LENGTHS, 2, 8) for _ in range(3))
    with pytest.raises(error, match=message):
        attnkit.attention(q, k, v, **kwargs)


def test_inputs_a_nested_call_cannot_take_are_named():
    """A dense tensor among nested ones, torch's strided nested layout, keys and values of different lengths, a
    ragged dim elsewhere than the length: each a named error."""
    _, q, _ = _jagged(LENGTHS, 2, 8)
    _, k, _ = _jagged([2, 2, 2, 2], 2, 8)
    dense = torch.randn(4, 2, 7, 8, dtype=torch.float64)
    with pytest.raises(TypeError, match="k must be a nested tensor like the others"):
        attnkit.attention(q, dense, dense)
    with pytest.raises(TypeError, match="q must be a nested tensor like the others"):
        attnkit.attention(dense, q, q)
    with pytest.raises(ValueError, match="k and v must hold sequences of the same lengths"):
        attnkit.attention(q, q, k)
    leaf, _, _ = _jagged(LENGTHS, 2, 8)
    with pytest.raises(ValueError, match="ragged length at dim 2"):
        attnkit.attention(leaf, leaf, leaf)
    strided = torch.nested.nested_tensor([torch.randn(2, 3, 8), torch.randn(2, 5, 8)])
    for args in ((strided, strided, strided), (dense, strided, strided)):
        with pytest.raises(TypeError, match="nested tensor of layout torch.strided"):
            attnkit.attention(*args)
