"""attention over each query's selected keys (DeepSeek sparse attention's second half) against the float64
oracle (attnkit.reference) given the same selection as a mask: outputs, weights, lse and gradients, shared
and per-head selections, repeats and empty slots, causality and padding, and the refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnkit import masks, reference
from attnkit.functional import topk
from attnkit.functional.topk import topk_attention

from helpers import numpy, randn


def _case(generator, *, per_head: bool, B=2, H=4, Hkv=2, L=9, S=13, K=5, dtype=torch.float64):
    q = randn(B, H, L, 8, dtype=dtype, generator=generator)
    k = randn(B, Hkv, S, 8, dtype=dtype, generator=generator)
    v = randn(B, Hkv, S, 6, dtype=dtype, generator=generator)
    shape = (B, Hkv, L, K) if per_head else (B, L, K)
    indices = torch.randint(-1, S, shape, generator=generator)
    indices[..., 0] = indices[..., 1]  # a repeated key counts once
    return q, k, v, indices


@pytest.fixture(params=["per-query", "union"])
def strategy(request, monkeypatch):
    """Each block of queries attends its selections one way or the other (the numbers must not tell which):
    forced here, whatever the cost rule would choose."""
    monkeypatch.setattr(topk, "_union_limit", lambda slots, groups: math.inf if request.param == "union" else -1)
    return request.param


def _oracle(q, k, v, indices, key_mask, causal, align):
    """The float64 oracle with the selection, padding and causality as one boolean mask (B, H, L, S)."""
    B, H, L, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    chosen = masks.selected(indices, S, heads=H) if indices.dim() == 4 else masks.selected(indices, S)
    allowed = chosen.expand(B, H, L, S).clone()
    if key_mask is not None:
        allowed &= key_mask[:, None, None, :]
    if causal:
        allowed &= masks.causal(L, S, causal_align=align)
    return reference.attention(numpy(q), numpy(k), numpy(v), mask=allowed.numpy())


@pytest.mark.parametrize("per_head", [False, True], ids=["shared", "per-key-head"])
@pytest.mark.parametrize(("causal", "align"), [(False, "top-left"), (True, "top-left"), (True, "bottom-right")])
def test_topk_attention_equals_the_oracle_with_the_selection_as_a_mask(per_head, causal, align, rng, monkeypatch,
                                                                       strategy):
    monkeypatch.setattr(topk, "GATHER_ELEMENTS", 200)  # several blocks of queries
    q, k, v, indices = _case(rng, per_head=per_head)
    key_mask = torch.ones(2, 13, dtype=torch.bool)
    key_mask[1, :4] = False
    want_out, want_weights, want_lse = _oracle(q, k, v, indices, key_mask, causal, align)
    got = topk_attention(q, k, v, indices, key_mask=key_mask, is_causal=causal, causal_align=align, need_weights=True)
    np.testing.assert_allclose(numpy(got.output), want_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(numpy(got.weights), want_weights, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(numpy(got.lse)), np.isneginf(want_lse))  # rows left without a key
    finite = np.isfinite(want_lse)
    np.testing.assert_allclose(numpy(got.lse)[finite], want_lse[finite], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("rows", ["per-query", "one-row"])
def test_a_mask_shared_by_the_heads_drops_the_selected_keys_it_rules_out(rows, rng, monkeypatch, strategy):
    monkeypatch.setattr(topk, "GATHER_ELEMENTS", 200)
    q, k, v, indices = _case(rng, per_head=True)
    mask = torch.rand(2, 1, 9 if rows == "per-query" else 1, 13, generator=rng) < 0.6
    got = topk_attention(q, k, v, indices, is_causal=True, mask=mask, need_weights=True)
    B, H, L, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    allowed = masks.selected(indices, S, heads=H).expand(B, H, L, S) & mask & masks.causal(L, S)
    want_out, want_weights, _ = reference.attention(numpy(q), numpy(k), numpy(v), mask=allowed.numpy())
    np.testing.assert_allclose(numpy(got.output), want_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(numpy(got.weights), want_weights, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="shared by the heads"):
        topk_attention(q, k, v, indices, mask=torch.ones(2, 4, 9, 13, dtype=torch.bool))


def test_gradients_equal_autograd_of_the_masked_softmax(rng, strategy):
    q, k, v, indices = _case(rng, per_head=False)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    got = topk_attention(*leaves, indices, is_causal=True)
    d_out = randn(*got.output.shape, dtype=torch.float64, generator=rng)
    d_lse = randn(*got.lse.shape, dtype=torch.float64, generator=rng)
    lse_part = (got.lse.nan_to_num(neginf=0.0) * d_lse).sum()
    ((got.output * d_out).sum() + lse_part).backward()
    mine = [x.grad for x in leaves]
    plain = [x.clone().requires_grad_() for x in (q, k, v)]
    allowed = masks.selected(indices, 13) & masks.causal(9, 13)
    groups = q.shape[1] // k.shape[1]
    scores = plain[0] @ plain[1].repeat_interleave(groups, 1).transpose(-1, -2) / math.sqrt(8)
    scores = scores.masked_fill(~allowed, -math.inf)
    p = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    out = p @ plain[2].repeat_interleave(groups, 1)
    lse = torch.logsumexp(scores, dim=-1)
    ((out * d_out).sum() + (lse.nan_to_num(neginf=0.0) * d_lse).sum()).backward()
    for a, b in zip(mine, plain):
        torch.testing.assert_close(a, b.grad, rtol=1e-10, atol=1e-12)


def test_values_that_are_the_keys_leading_numbers_are_gathered_once_with_the_same_results(rng, monkeypatch,
                                                                                         strategy):
    """MLA's absorbed attention: v = k[..., :Ev], a view. One gather serves both; the numbers and the gradients
    (through both uses of k) are those of a separate copy."""
    monkeypatch.setattr(topk, "GATHER_ELEMENTS", 300)
    q, k, _, indices = _case(rng, per_head=False)
    calls = []
    real = topk._gathered
    monkeypatch.setattr(topk, "_gathered", lambda x, index: calls.append(x.shape[-1]) or real(x, index))
    real_select = torch.Tensor.index_select
    if strategy == "union":  # the union's gathers are index_selects of whole key rows
        monkeypatch.setattr(torch.Tensor, "index_select",
                            lambda x, dim, index: calls.append(x.shape[-1]) or real_select(x, dim, index))
    results = []
    for view in (True, False):
        calls.clear()
        q_leaf, k_leaf = q.clone().requires_grad_(), k.clone().requires_grad_()
        v = k_leaf[..., :6] if view else k_leaf[..., :6].clone()
        got = topk_attention(q_leaf, k_leaf, v, indices, is_causal=True)
        got.output.sum().backward()
        results.append((got.output.detach(), q_leaf.grad, k_leaf.grad, list(calls)))
    (out_view, dq_view, dk_view, gathers_view), (out_copy, dq_copy, dk_copy, gathers_copy) = results
    assert set(gathers_view) == {8} and set(gathers_copy) == {8, 6}  # the view: keys only
    torch.testing.assert_close(out_view, out_copy, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(dq_view, dq_copy, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(dk_view, dk_copy, rtol=1e-12, atol=1e-14)


def test_weights_of_chosen_heads_are_those_heads_of_all_weights(rng, strategy):
    q, k, v, indices = _case(rng, per_head=True)
    every = topk_attention(q, k, v, indices, is_causal=True, need_weights=True).weights
    chosen = topk_attention(q, k, v, indices, is_causal=True, need_weights=[3, 0]).weights
    torch.testing.assert_close(chosen, every[:, [3, 0]], rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"need_weights must be a bool or a non-empty sequence of head indices"):
        topk_attention(q, k, v, indices, need_weights=[4])


def test_the_nan_rule_holds(rng, strategy, nan_rule_on):
    q, k, v, indices = _case(rng, per_head=False)
    k[0, 1, 12, 0] = math.nan  # a key no query may select still poisons its key head's query heads
    out = topk_attention(q, k, v, indices.clamp(max=11)).output
    assert out[0, 2:].isnan().all() and not out[0, :2].isnan().any() and not out[1].isnan().any()


@pytest.mark.parametrize(("indices", "error", "match"), [
    (torch.zeros(2, 9), ValueError, r"indices must have shape \(B, L, K\)"),
    (torch.zeros(2, 9, 3), TypeError, "integer key positions"),
    (torch.full((2, 9, 3), 13), ValueError, r"in \[0, S=13\)"),
    (torch.zeros(2, 3, 9, 3, dtype=torch.long), ValueError, r"\(B, Hkv, L, K\) = \(2, 2, 9, K\)"),
])
def test_bad_selections_are_named(indices, error, match, rng):
    q, k, v, _ = _case(rng, per_head=False)
    with pytest.raises(error, match=match):
        topk_attention(q, k, v, indices)


def test_each_block_attends_the_union_of_its_selections_where_that_costs_less(rng, monkeypatch):
    """The cost rule: a block whose queries select the same keys scores them once against the union (no
    per-query gather); a block of scattered selections from many keys gathers per query. Either way the
    numbers are the other way's (float32, one GEMM against many small ones)."""
    gathers = []
    real = topk._gathered
    monkeypatch.setattr(topk, "_gathered", lambda x, index: gathers.append(index.shape) or real(x, index))
    q = randn(1, 8, 64, 16, generator=rng)
    k, v = randn(1, 1, 4096, 16, generator=rng), randn(1, 1, 4096, 16, generator=rng)
    shared = torch.randperm(4096, generator=rng)[:32].expand(1, 64, 32)  # u = 32 <= 32 x (1 + 32 / 8)
    scattered = torch.stack([torch.randperm(4096, generator=rng)[:32] for _ in range(64)])[None]  # u near 2,048
    results = {}
    for name, indices in (("shared", shared), ("scattered", scattered)):
        gathers.clear()
        results[name] = topk_attention(q, k, v, indices, need_weights=True)
        assert bool(gathers) == (name == "scattered"), name
        monkeypatch.setattr(topk, "_union_limit", lambda slots, groups: math.inf if name == "scattered" else -1)
        other = topk_attention(q, k, v, indices, need_weights=True)
        monkeypatch.undo()
        monkeypatch.setattr(topk, "_gathered", lambda x, index: gathers.append(index.shape) or real(x, index))
        for a, b in zip(results[name], other):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert topk._union_limit(32, 8) == 32 * 5


def test_blocks_attended_either_way_in_one_call_equal_the_oracle(rng, monkeypatch):
    """The cost rule chooses per block: early queries whose selections overlap take the union, later ones with
    scattered selections fall back to per-query gathers inside the same larger block; float64, 1e-10."""
    monkeypatch.setattr(topk, "GATHER_ELEMENTS", 2 * 4 * 14)  # two queries' 4 keys and values (8 + 6) at once
    monkeypatch.setattr(topk, "UNION_SCORES", 12 * 4 * 36)  # union blocks of 12 queries: G 4, at most 4 x 9 keys
    taken = []
    real_union, real_each = topk._attend_union, topk._attend_each
    monkeypatch.setattr(topk, "_attend_union", lambda q, *a: taken.append(("union", q.shape[-2])) or real_union(q, *a))
    monkeypatch.setattr(topk, "_attend_each", lambda q, *a: taken.append(("each", q.shape[-2])) or real_each(q, *a))
    q, k, v, _ = _case(rng, per_head=False, B=1, H=4, Hkv=1, L=36, S=200, K=4)
    indices = torch.stack([torch.randperm(200, generator=rng)[:4] for _ in range(36)])[None]  # about 44 a block
    indices[0, :12] = torch.tensor([3, 5, 7, 7])  # one union of 3 keys
    want_out, want_weights, want_lse = _oracle(q, k, v, indices, None, False, "top-left")
    got = topk_attention(q, k, v, indices, need_weights=True)
    np.testing.assert_allclose(numpy(got.output), want_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(numpy(got.weights), want_weights, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(numpy(got.lse), want_lse, rtol=1e-10, atol=1e-12)
    assert taken == [("union", 12)] + [("each", 2)] * 12, taken
