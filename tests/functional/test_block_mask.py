"""Block masks and sparse patterns: each pattern against a definition written here with plain
loops, every backend against the float64 oracle with the dense equivalent (outputs, weights, lse,
gradients), score_mod against the oracle, and the tiled backend's skipping checked directly."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import attnkit
from attnkit import masks, reference
from attnkit.functional.backends import tiled
from attnkit.functional.block_mask import EMPTY, FULL, PARTIAL

from helpers import DTYPES, OpsSeen, assert_close, numpy, randn

BACKENDS = ["reference", "sdpa", "tiled", "auto"]
attention_module = importlib.import_module("attnkit.functional.attention")


def definition(name: str, L: int, S: int, B: int, extra) -> np.ndarray:
    """(B, L, S) boolean, the pattern written out pair by pair."""
    out = np.zeros((B, L, S), dtype=bool)
    for b in range(B):
        for i in range(L):
            for j in range(S):
                if name == "causal":
                    ok = j <= i + extra["offset"]
                elif name == "window":
                    ok = abs(i - j) <= extra["window"] // 2
                elif name == "longformer":
                    g = extra["globals"][b]
                    ok = abs(i - j) <= extra["window"] // 2 or g[i] or g[j]
                elif name == "bigbird":
                    block, table = extra["block"], extra["table"]
                    qb, kb = i // block, j // block
                    ok = abs(qb - kb) <= extra["window"] // 2 or qb < extra["num_global"] or kb < extra["num_global"] or table[qb, kb]
                elif name == "prefix-lm":
                    ok = j <= i or j < extra["prefix"][b]
                elif name == "documents":
                    ids = extra["ids"][b]
                    ok = ids[i] >= 0 and ids[i] == ids[j] and j <= i
                elif name == "dilated":
                    d, radius = extra["dilation"], extra["window"] // 2
                    ok = (i - j) % d == 0 and abs(i - j) <= radius * d
                elif name == "sinks":
                    a = i + extra["offset"]
                    ok = j <= a and (j < extra["sinks"] or j > a - extra["window"])
                else:
                    raise AssertionError(name)
                out[b, i, j] = ok
    return out


def pattern(name: str, L: int, S: int, B: int):
    """(mask_mod, B for block_mask, extra for the definition)."""
    if name == "causal":  # bottom-right aligned: the last query sees every key
        return masks.causal_mod(L, S, causal_align="bottom-right"), None, {"offset": S - L}
    if name == "window":
        return masks.window_mod(10), None, {"window": 10}
    if name == "longformer":
        flags = torch.zeros(B, L, dtype=torch.bool)
        flags[0, [0, 7]] = True
        flags[1, [L - 1]] = True
        return masks.longformer_mod(8, flags), B, {"window": 8, "globals": flags.numpy()}
    if name == "bigbird":
        mod = masks.bigbird_mod(L, S, window_blocks=3, num_global=1, random_blocks=2, block=8, seed=3)
        return mod, None, {"window": 3, "num_global": 1, "block": 8, "table": mod.random_table.numpy()}
    if name == "prefix-lm":
        prefix = torch.tensor([5, 17])
        return masks.prefix_lm_mod(prefix), B, {"prefix": prefix.numpy()}
    if name == "documents":
        ids = torch.tensor([[0] * 10 + [1] * 20 + [2] * (L - 30), [0] * 25 + [1] * (L - 30) + [-1] * 5])
        return masks.document_mod(ids), B, {"ids": ids.numpy()}
    if name == "dilated":
        return masks.dilated_window_mod(6, 3), None, {"window": 6, "dilation": 3}
    if name == "sinks":
        return masks.sinks_window_mod(3, 7, L, S, causal_align="bottom-right"), None, {"sinks": 3, "window": 7, "offset": S - L}
    raise AssertionError(name)


SIZES = {  # (L, S): non-multiples of the blocks; L != S where the pattern means it
    "causal": (20, 45), "window": (45, 45), "longformer": (45, 45), "bigbird": (45, 45), "prefix-lm": (45, 45),
    "documents": (45, 45), "dilated": (45, 45), "sinks": (20, 45),
}
PATTERN_NAMES = list(SIZES)


@pytest.mark.parametrize("block", [(16, 8), 7])
@pytest.mark.parametrize("name", PATTERN_NAMES)
def test_pattern_equals_its_definition_and_tiles_are_classified_exactly(name, block):
    L, S = SIZES[name]
    mod, B, extra = pattern(name, L, S, 2)
    bm = masks.block_mask(mod, B, None, L, S, block=block)
    dense = numpy(bm.to_dense())[:, 0]  # (B|1, L, S)
    expected = definition(name, L, S, 2, extra)
    np.testing.assert_array_equal(np.broadcast_to(dense, expected.shape), expected)
    # Each tile's kind from the dense mask, by brute force.
    block_q, block_k = bm.block_size
    kinds = bm.kinds.numpy()
    for b in range(kinds.shape[0]):
        for i in range(kinds.shape[2]):
            for j in range(kinds.shape[3]):
                tile = dense[b, i * block_q : (i + 1) * block_q, j * block_k : (j + 1) * block_k]
                want = FULL if tile.all() else PARTIAL if tile.any() else EMPTY
                assert kinds[b, 0, i, j] == want, (b, i, j)
    again = masks.BlockMask.from_dense(bm.to_dense(), block=block)
    assert torch.equal(again.kinds, bm.kinds)


def _call(name, dtype, generator, H=4, Hkv=2, E=8):
    L, S = SIZES[name]
    B = 2
    mod, mask_B, _ = pattern(name, L, S, B)
    bm = masks.block_mask(mod, mask_B, None, L, S, block=(16, 8))
    q = randn(B, H, L, E, dtype=dtype, generator=generator, requires_grad=True)
    k = randn(B, Hkv, S, E, dtype=dtype, generator=generator, requires_grad=True)
    v = randn(B, Hkv, S, E, dtype=dtype, generator=generator, requires_grad=True)
    return q, k, v, bm


def _grads(result, q, k, v, generator):
    d_out = torch.randn(result.output.shape, generator=generator, dtype=torch.float64).to(result.output.dtype)
    return torch.autograd.grad(result.output, (q, k, v), d_out)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", PATTERN_NAMES)
def test_every_backend_matches_the_float64_oracle_on_every_pattern(name, backend, dtype, rng, small_tiles):
    q, k, v, bm = _call(name, dtype, rng)
    dense = bm.to_dense()
    result = attnkit.attention(q, k, v, mask=bm, backend=backend, need_weights=True)
    out, weights, lse = reference.attention(numpy(q), numpy(k), numpy(v), mask=numpy(dense))
    assert_close(result.output, out, dtype, "output")
    assert_close(result.weights, weights, dtype, "weights")
    if result.lse is not None:
        got = numpy(result.lse)
        assert (np.isneginf(got) == np.isneginf(lse)).all(), "lse is -inf exactly on empty rows"
        finite = np.isfinite(lse)
        np.testing.assert_allclose(got[finite], lse[finite], rtol=1e-5 if dtype != torch.bfloat16 else 2e-2, atol=1e-5)
    if dtype == torch.bfloat16:
        return
    # Gradients against float64 autograd through the reference backend with the dense mask.
    generator = torch.Generator().manual_seed(7)
    got = _grads(result, q, k, v, generator)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    expected = attnkit.attention(q64, k64, v64, mask=dense, backend="reference")
    want = _grads(expected, q64, k64, v64, torch.Generator().manual_seed(7))
    for what, a, b in zip("qkv", got, want):
        assert_close(a, numpy(b), dtype, f"d{what}")
        assert torch.isfinite(a).all()


def test_empty_rows_give_zeros_in_every_backend(rng, small_tiles):
    """The documents pattern's padding (id -1) rows attend nothing: zero output, zero weights."""
    q, k, v, bm = _call("documents", torch.float32, rng)
    for backend in BACKENDS:
        result = attnkit.attention(q, k, v, mask=bm, backend=backend, need_weights=True)
        assert (result.output[1, :, -5:] == 0).all() and (result.weights[1, :, -5:] == 0).all(), backend


def test_the_tiled_backend_skips_empty_tiles_and_does_no_mask_work_on_full_ones(rng, monkeypatch):
    """Record every block the tiled backend computes, forward and backward: none meets an empty
    tile, and the mask is evaluated only where some tile of the run is partial."""
    L = S = 256
    flags = torch.zeros(L, dtype=torch.bool)
    flags[:4] = True
    bm = masks.block_mask(masks.longformer_mod(64, flags), None, None, L, S, block=32)
    seen = []
    original = tiled._Blocks.scores

    def recording(self, q_block, k_t, q0, q1, k0, k1, partial=False, **kw):
        seen.append((q0, q1, k0, k1, partial))
        return original(self, q_block, k_t, q0, q1, k0, k1, partial, **kw)

    monkeypatch.setattr(tiled._Blocks, "scores", recording)
    tiles = []
    real_additive = masks.BlockMask.additive

    def counting_additive(self, *args):
        tiles.append(args[:4])
        return real_additive(self, *args)

    monkeypatch.setattr(masks.BlockMask, "additive", counting_additive)
    q, k, v = (randn(1, 2, L, 16, generator=rng, requires_grad=True) for _ in range(3))
    out = attnkit.attention(q, k, v, mask=bm, backend="tiled").output
    out.sum().backward()
    kinds = bm.kinds[0, 0]
    assert seen, "no block computed"
    assert sorted(tiles) == sorted(block[:4] for block in seen if block[4]), "the mask is applied on partial runs only"
    assert len(bm._additive) == len(tiles) // 2, "each partial run's mask is evaluated once, reused in backward"
    computed = torch.zeros(L, S, dtype=torch.bool)
    for q0, q1, k0, k1, partial in seen:
        rows, cols = slice(q0 // 32, -(-q1 // 32)), slice(k0 // 32, -(-k1 // 32))
        assert (kinds[rows, cols] != EMPTY).all(), "an empty tile was computed"
        if not partial:
            assert (kinds[rows, cols] == FULL).all(), "a partial tile was computed without its mask"
        computed[q0:q1, k0:k1] = True
    # Every non-empty tile was computed (forward and backward each visit it once).
    assert computed.equal(bm.kinds[0, 0].ne(EMPTY).repeat_interleave(32, 0).repeat_interleave(32, 1))
    assert len(seen) % 2 == 0
    torch.testing.assert_close(out, attnkit.attention(q, k, v, mask=bm.to_dense(), backend="reference").output)


# ------------------------------------------------------------------------------------------ score_mod

SLOPES = [0.5, 0.25, 0.125, 0.0625]


def alibi(score, b, h, q_idx, kv_idx):
    return score + torch.tensor(SLOPES, dtype=score.dtype)[h] * (kv_idx - q_idx)


def softcap(score, b, h, q_idx, kv_idx):
    return 3.0 * torch.tanh(score / 3.0)


RELATIVE = torch.linspace(-1.0, 1.0, 2 * 64 - 1, dtype=torch.float64)


def relative(score, b, h, q_idx, kv_idx):
    return score + RELATIVE.to(score.dtype)[kv_idx - q_idx + 63]


ORACLE_MODS = {  # the same functions on one row of NumPy scores (row i, key indices `keys`)
    "alibi": (alibi, lambda s, b, h, i, keys: s + SLOPES[h] * (keys - i)),
    "softcap": (softcap, lambda s, b, h, i, keys: 3.0 * np.tanh(s / 3.0)),
    "relative": (relative, lambda s, b, h, i, keys: s + RELATIVE.numpy()[keys - i + 63]),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("backend", ["reference", "tiled", "auto"])
@pytest.mark.parametrize("mod", list(ORACLE_MODS))
@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("Hkv", [2, 4], ids=["grouped", "one-per-head"])
def test_score_mod_matches_the_oracle_with_gradients(mod, backend, dtype, with_mask, Hkv, rng, small_tiles):
    torch_mod, numpy_mod = ORACLE_MODS[mod]
    q, k, v, bm = _call("longformer", dtype, rng, Hkv=Hkv)
    mask = bm if with_mask else None
    dense = numpy(bm.to_dense()) if with_mask else None
    result = attnkit.attention(q, k, v, mask=mask, is_causal=True, score_mod=torch_mod, backend=backend, need_weights=True)
    out, weights, lse = reference.attention(numpy(q), numpy(k), numpy(v), mask=dense, is_causal=True, score_mod=numpy_mod)
    assert_close(result.output, out, dtype, "output")
    assert_close(result.weights, weights, dtype, "weights")
    got = _grads(result, q, k, v, torch.Generator().manual_seed(3))
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    expected = attnkit.attention(q64, k64, v64, mask=None if mask is None else bm.to_dense(), is_causal=True,
                                 score_mod=torch_mod, backend="reference")
    want = _grads(expected, q64, k64, v64, torch.Generator().manual_seed(3))
    for what, a, b in zip("qkv", got, want):
        assert_close(a, numpy(b), dtype, f"d{what}")


@pytest.mark.parametrize("backend", ["reference", "tiled"])
def test_a_mod_that_writes_into_its_index_tensors_changes_only_its_own_call(backend, rng, small_tiles):
    """The index tensors are built once per tile and kept, but every call gets its own copies."""
    q, k, v = (randn(1, 2, 16, 8, generator=rng) for _ in range(3))
    seen = []

    def vandal(score, b, h, q_idx, kv_idx):
        seen.append((b.clone(), h.clone(), q_idx.clone(), kv_idx.clone()))
        kv_idx += 100  # in place: this call's own tensors
        q_idx.zero_()
        return score - kv_idx.to(score.dtype) * 0.0 + q_idx.to(score.dtype)

    first = attnkit.attention(q, k, v, score_mod=vandal, backend=backend).output
    count = len(seen)
    again = attnkit.attention(q, k, v, score_mod=vandal, backend=backend).output
    assert torch.equal(first, again)
    assert len(seen) == 2 * count  # each call saw the same index tensors as the other, untouched by the other's writes
    for before, after in zip(seen[:count], seen[count:]):
        assert all(torch.equal(x, y) for x, y in zip(before, after))
    b, h, q_idx, kv_idx = seen[-1]  # the last tile's (the probes of the tiled backend come first)
    assert b.dtype == h.dtype == q_idx.dtype == kv_idx.dtype == torch.int32
    assert torch.equal(h.view(-1), torch.arange(2, dtype=torch.int32)) and b.shape == (1, 1, 1, 1) and b.item() == 0
    assert torch.all(q_idx.view(-1).diff() == 1) and torch.all(kv_idx.view(-1).diff() == 1)
    assert q_idx.view(-1)[-1] == 15 and kv_idx.view(-1)[-1] == 15

    def mask_vandal(b, h, q_idx, kv_idx):
        allowed = kv_idx <= q_idx
        q_idx += 1000
        return allowed

    blocks = masks.block_mask(mask_vandal, None, None, 16, 16, block=(8, 8))
    assert torch.equal(blocks.to_dense(), masks.causal(16, 16)[None, None])
    assert torch.equal(masks.block_mask(mask_vandal, None, None, 16, 16, block=(8, 8)).to_dense(), blocks.to_dense())


def test_index_tensors_are_fresh_under_inference_mode_and_built_afresh_under_a_fake_tensor_mode(rng):
    """Tensors first asked for under inference_mode are kept as ordinary ones: a later call under autograd gets
    copies it can save for backward (a learned table indexed by h), as it would get fresh aranges."""
    from attnkit.functional import block_mask as block_mask_module

    block_mask_module._kept_grids.cache_clear()
    cpu = torch.device("cpu")
    with torch.inference_mode():
        inside = block_mask_module.index_grids(2, 3, 4, 9, 0, 7, cpu)
        assert all(x.is_inference() for x in inside)  # as fresh aranges made there would be
    assert not any(x.is_inference() for x in block_mask_module._kept_grids(2, 3, 4, 9, 0, 7, cpu))
    b, h, q_idx, kv_idx = block_mask_module.index_grids(2, 3, 4, 9, 0, 7, cpu)
    assert not any(x.is_inference() for x in (b, h, q_idx, kv_idx))
    table = torch.randn(3, requires_grad=True)
    (table[h] * (q_idx - kv_idx)).sum().backward()  # h saved for the backward of the indexing
    assert table.grad is not None
    q_idx.add_(1)  # the caller's own tensor
    want = (torch.arange(2).view(2, 1, 1, 1), torch.arange(3).view(1, 3, 1, 1), torch.arange(4, 9).view(1, 1, 5, 1),
            torch.arange(7).view(1, 1, 1, 7))
    for got, expected in zip(block_mask_module.index_grids(2, 3, 4, 9, 0, 7, cpu), want):
        assert got.dtype == torch.int32 and torch.equal(got, expected.int())
    with OpsSeen() as mode:  # an op counter sees real tensors: the kept ones' copies, as without it
        block_mask_module.index_grids(2, 3, 4, 9, 0, 7, cpu)
    assert sum("clone" in op for op in mode.seen) == 4 and not any(op.startswith("aten.arange") for op in mode.seen)
    kept = block_mask_module._kept_grids.cache_info().currsize
    with FakeTensorMode():  # (what torch.export traces under): built afresh, and a fake tile is never kept
        fresh = block_mask_module.index_grids(2, 3, 4, 9, 0, 8, cpu)
    assert all(isinstance(x, FakeTensor) for x in fresh)
    assert block_mask_module._kept_grids.cache_info().currsize == kept


def test_a_learned_score_mod_goes_to_reference_and_the_tiled_backend_refuses_it(rng):
    table = torch.zeros(2 * 16 - 1, requires_grad=True)

    def learned(score, b, h, q_idx, kv_idx):
        return score + table[kv_idx - q_idx + 15]

    q, k, v = (randn(1, 2, 16, 8, generator=rng, requires_grad=True) for _ in range(3))
    with pytest.raises(ValueError, match="score_mod reads tensors that require gradients"):
        attnkit.attention(q, k, v, score_mod=learned, backend="tiled")
    attnkit.attention(q, k, v, score_mod=learned).output.sum().backward()  # auto: reference
    assert table.grad is not None and table.grad.abs().sum() > 0


def test_sdpa_refuses_a_score_mod_and_bad_score_mods_are_named(rng):
    q, k, v = (randn(1, 2, 16, 8, generator=rng) for _ in range(3))
    with pytest.raises(ValueError, match="sdpa backend cannot apply a score_mod"):
        attnkit.attention(q, k, v, score_mod=softcap, backend="sdpa")
    with pytest.raises(ValueError, match="score_mod must return a tensor of the score's shape"):
        attnkit.attention(q, k, v, score_mod=lambda s, b, h, i, j: s.sum(-1), backend="tiled")
    with pytest.raises(TypeError, match="score_mod must be callable"):
        attnkit.attention(q, k, v, score_mod=3)


# ------------------------------------------------------------------------------------------ choices and errors


def test_auto_classifies_a_sparse_boolean_mask_and_leaves_a_dense_one_to_sdpa(monkeypatch):
    chosen = []
    real = attention_module.choose_backend
    monkeypatch.setattr(attention_module, "choose_backend", lambda p: chosen.append((p, real(p))) or chosen[-1][1])
    n = 2048
    band = masks.window_mod(256)(None, None, torch.arange(n)[:, None], torch.arange(n)[None, :])
    q = torch.randn(1, 1, n, 8)
    attnkit.attention(q, q, q, mask=band)
    problem, name = chosen[-1]
    assert name == "tiled" and problem.block_mask is not None and problem.block_mask.occupancy() < 0.2
    noisy = torch.rand(n, n, generator=torch.Generator().manual_seed(0)) < 0.5
    attnkit.attention(q, q, q, mask=noisy)
    problem, name = chosen[-1]
    assert name == "sdpa" and problem.block_mask is None and problem.mask is noisy
    small = band[:512, :512]
    q = q[:, :, :512]
    attnkit.attention(q, q, q, mask=small)
    assert chosen[-1][1] == "sdpa", "below AUTO_CLASSIFY_MIN_ENTRIES the mask is not classified"


def test_block_mask_errors_name_the_problem():
    q = torch.randn(2, 4, 32, 8)
    with pytest.raises(ValueError, match=r"does not fit \(B, H, L, S\) = \(2, 4, 32, 32\)"):
        attnkit.attention(q, q, q, mask=masks.block_mask(masks.causal_mod(), None, None, 32, 40))
    with pytest.raises(TypeError, match="mask_mod must return a boolean tensor"):
        masks.block_mask(lambda b, h, i, j: (i - j).float(), None, None, 8, 8)
    with pytest.raises(ValueError, match="does not broadcast to the tile"):
        masks.block_mask(lambda b, h, i, j: torch.ones(3, 3, 3, 3, dtype=torch.bool), None, None, 8, 8)
    flags = torch.zeros(2, 32, dtype=torch.bool)
    with pytest.raises(ValueError, match="built with B=1; pass B=2"):
        masks.block_mask(masks.longformer_mod(8, flags), None, None, 32, 32)
    with pytest.raises(ValueError, match="block must be a positive int"):
        masks.block_mask(masks.causal_mod(), None, None, 8, 8, block=0)
    with pytest.raises(ValueError, match="pattern must be one of"):
        masks.pattern_block_mask("swirl", 64)


def test_bigbird_draws_its_random_blocks_from_the_seed():
    a = masks.bigbird_mod(256, window_blocks=3, num_global=1, random_blocks=3, block=16, seed=1)
    b = masks.bigbird_mod(256, window_blocks=3, num_global=1, random_blocks=3, block=16, seed=1)
    c = masks.bigbird_mod(256, window_blocks=3, num_global=1, random_blocks=3, block=16, seed=2)
    assert torch.equal(a.random_table, b.random_table) and not torch.equal(a.random_table, c.random_table)
    assert (a.random_table.sum(dim=1) == 3).all()


def test_a_block_mask_and_the_structural_causal_mask_combine(rng, small_tiles):
    q, k, v, bm = _call("window", torch.float64, rng)
    dense = bm.to_dense() & masks.causal(45)
    for backend in BACKENDS:
        got = attnkit.attention(q, k, v, mask=bm, is_causal=True, backend=backend).output
        want = attnkit.attention(q, k, v, mask=dense, backend="reference").output
        torch.testing.assert_close(got, want)


@pytest.mark.slow
def test_dropout_with_a_block_mask_is_the_same_in_forward_and_backward(small_tiles):
    """gradcheck through the tiled backend with dropout and a block mask (the keep-mask of each
    block must be regenerated identically in the backward pass)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 20, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    bm = masks.block_mask(masks.window_mod(6), None, None, 20, 20, block=8)
    seed = torch.initial_seed()

    def fn(q, k, v):
        torch.manual_seed(seed)
        return attnkit.attention(q, k, v, mask=bm, dropout_p=0.3, backend="tiled").output

    assert torch.autograd.gradcheck(fn, (q, k, v))
