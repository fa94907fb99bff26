"""What attention() keeps between calls to cost nothing per call, and the shortcuts it takes, each held to the same
numbers as the long way: a default call dispatches SDPA's ops and nothing that reads q, k, v or the output (the NaN
rule is off); with the rule on, every plain and masked call gives exactly its rows; a mask's empty-row look kept on
the mask (an in-place change looks again), small structural masks kept per shape, a BlockMask's occupancy, flex's
prepared calls, and attention_trusted for the layers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnkit
from attnkit import masks
from attnkit.functional import nan
from attnkit.functional.attention import attention_trusted
from attnkit.functional.backends import common, flex, sdpa

from helpers import OpsSeen, randn

SHAPES = [(1, 4, 4, 16, 16, 32), (2, 8, 2, 33, 97, 64), (1, 4, 1, 1, 128, 32), (1, 2, 2, 300, 300, 64),
          (1, 2, 2, 128, 40, 16), (1, 2, 2, 64, 64, 8),
          # below a vector's width SDPA's CPU kernels drop a NaN query: the rule still gives its rows
          (1, 1, 1, 1, 1, 8), (1, 2, 1, 1, 3, 16), (1, 2, 2, 5, 7, 16), (2, 4, 2, 9, 4, 8), (1, 2, 2, 3, 3, 64)]


def _expected_nan_rows(where: str, index: int, B: int, H: int, Hkv: int, L: int) -> torch.Tensor:
    """The rows the NaN rule poisons for one NaN at batch B-1, head (or key head) last, position index."""
    rows = torch.zeros(B, H, L, dtype=torch.bool)
    if where == "q":
        rows[-1, -1, index] = True
    else:
        group = H // Hkv
        rows[-1, H - group:] = True
    return rows


def _one_nan_each(shape: tuple, dtype: torch.dtype, generator: torch.Generator):
    """Fresh q (B, H, L, E), k and v (B, Hkv, S, E) of ``shape`` (B, H, Hkv, L, S, E) with one NaN, in q, k or v, at
    the first, middle and last position of the last head of the last sequence: yields (where, position, q, k, v)."""
    B, H, Hkv, L, S, E = shape
    for where in ("q", "k", "v"):
        for position in ("first", "middle", "last"):
            q, k, v = (randn(B, n, m, E, dtype=dtype, generator=generator) for n, m in ((H, L), (Hkv, S), (Hkv, S)))
            target = {"q": q, "k": k, "v": v}[where]
            index = {"first": 0, "middle": target.shape[2] // 2, "last": target.shape[2] - 1}[position]
            target[-1, -1, index, 3] = float("nan")
            yield where, index, q, k, v


PLAIN_CALLS = [(shape, causal) for shape in SHAPES for causal in (False, True)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape, is_causal", PLAIN_CALLS, ids=[f"{s}-{'causal' if c else 'full'}" for s, c in PLAIN_CALLS])
def test_with_the_rule_on_a_plain_call_gives_exactly_its_rows(dtype, shape, is_causal, nan_rule_on):
    """With the NaN rule on, a plain call poisons exactly the rule's rows, at every length (decoding steps with one
    key included, where SDPA returns a finite row for a NaN query, and causal calls with L < S, where a key no query
    sees shows nothing in SDPA's output), and leaves every other row SDPA's."""
    B, H, Hkv, L, S, E = shape
    for where, index, q, k, v in _one_nan_each(shape, dtype, torch.Generator().manual_seed(1)):
        out = attnkit.attention(q, k, v, is_causal=is_causal).output
        rows = _expected_nan_rows(where, index, B, H, Hkv, L)
        assert torch.equal(out.isnan().any(-1), rows), (where, index)
        assert torch.equal(out.isnan().all(-1), rows), (where, index)  # a poisoned row is NaN throughout
        raw = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=H != Hkv)
        torch.testing.assert_close(out[~rows], raw[~rows], rtol=0, atol=0)


def _masks(B: int, L: int, S: int, generator: torch.Generator) -> dict[str, object]:
    """The masks attention()'s direct path hands SDPA: padding (one sequence's keys mostly padding), a random
    one with a row no key is allowed to and a key no query may attend, a causal window, a block mask."""
    random = torch.rand(B, 1, L, S, generator=generator) < 0.6
    random[:, :, L // 2] = False
    random[:, :, :, S // 2] = False
    square = {"blocks": masks.causal_block_mask(L, block=8)} if L == S else {}
    return {"padding": masks.padding(torch.tensor([S - 3, 1][:B]), S), "random": random,
            "window": masks.sliding_window(L, S, 3, causal_align="bottom-right"), **square}


MASKED_SHAPES = [(2, 4, 2, 9, 11, 8), (1, 4, 1, 1, 40, 16), (2, 4, 4, 16, 16, 32), (1, 2, 2, 3, 5, 16)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", MASKED_SHAPES, ids=str)
def test_with_the_rule_on_a_masked_call_gives_exactly_its_rows(dtype, shape, nan_rule_on):
    """With the NaN rule on, a call under every kind of mask poisons exactly the rule's rows: a NaN in a key no query
    may attend and a NaN query whose row has no allowed key included; the other rows are SDPA's."""
    B, H, Hkv, L, S, E = shape
    generator = torch.Generator().manual_seed(2)
    options = {"dropout_p": 0.0, "scale": E**-0.5, "enable_gqa": H != Hkv}
    for name, mask in _masks(B, L, S, generator).items():
        for where, index, q, k, v in _one_nan_each(shape, dtype, generator):
            out = attnkit.attention(q, k, v, mask=mask).output
            expected = _expected_nan_rows(where, index, B, H, Hkv, L)
            assert torch.equal(out.isnan().any(-1), expected), (name, where, index)
            raw = sdpa.masked(q, k, v, mask if isinstance(mask, torch.Tensor) else mask.to_dense(), None, options)
            tolerance = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 2e-2)  # (auto may pick another kernel)
            torch.testing.assert_close(out[~expected], raw[~expected], rtol=tolerance, atol=tolerance)




DEFAULT_CALLS = {  # what attention() is asked, and the SDPA call it stands for
    "dense": ({}, {}),
    "causal": ({"is_causal": True}, {"is_causal": True}),
    "decoding step": ({"is_causal": True, "causal_align": "bottom-right"}, {}),
    "padding": ({"mask": masks.padding(torch.tensor([14, 9]), 16)},
                {"attn_mask": masks.padding(torch.tensor([14, 9]), 16)}),
    "window": ({"window": 4}, {"attn_mask": masks.sliding_window(16, 16, 4)}),
    "block mask": ({"mask": masks.causal_block_mask(16, block=8)}, {"attn_mask": masks.causal_block_mask(16, block=8).to_dense()}),
}
READS_VALUES = ("amax", "max", "equal", "isnan", "where", "any", "all", "_foreach", "_local_scalar_dense", "item")


@pytest.mark.parametrize("case", DEFAULT_CALLS)
def test_a_default_call_reads_no_value_and_returns_what_sdpa_returns(case):
    """The NaN rule is off by default: a call dispatches no maximum, comparison, isnan, where or host read beyond
    those SDPA's own call dispatches, once what it keeps per mask and shape is built; its output is SDPA's bit for bit, a NaN in a query row or a key included (SDPA's
    own NaN, whatever it is)."""
    assert not nan.on()
    ours, theirs = DEFAULT_CALLS[case]
    L = 1 if case == "decoding step" else 16
    generator = torch.Generator().manual_seed(5)
    q, k, v = (randn(2, 4, n, 16, generator=generator) for n in (L, 16, 16))
    q[1, 2, 0, 3] = float("nan")
    k[0, 1, 5, 0] = float("nan")
    attnkit.attention(q, k, v, **ours)  # what is kept per mask and shape (a window's mask, its empty-row look) is built
    with OpsSeen() as ops:
        got = attnkit.attention(q, k, v, **ours).output
    with OpsSeen() as sdpas:
        want = F.scaled_dot_product_attention(q, k, v, **theirs)

    def reads(seen: list[str]) -> list[str]:
        return sorted(op for op in seen if any(word in op.split(".")[1] for word in READS_VALUES))

    assert reads(ops.seen) == reads(sdpas.seen), ops.seen  # (SDPA's own: a boolean mask's where)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("backend", ["auto", "reference", "sdpa", "tiled"])
def test_the_rule_switches_on_and_off_globally_and_in_a_block(backend):
    """nan_rule(True) is a global switch (called alone) and a context manager (restores on exit); with it on, a NaN
    query row is NaN in every backend, with it off each backend's kernel decides (the reference backend's NaN query
    is NaN anyway; SDPA's may be)."""
    q, k, v = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    k[0, 1, 8, 0] = float("nan")  # a key no query of a causal top-left call sees: shows in no kernel's output
    assert not nan.on()
    off = attnkit.attention(q, k, v, is_causal=True, backend=backend).output
    assert not off.isnan().any()
    try:
        attnkit.nan_rule(True)
        assert nan.on()
        on = attnkit.attention(q, k, v, is_causal=True, backend=backend).output
        assert on[0, 1].isnan().all() and torch.equal(on[0, 0], off[0, 0])
        with attnkit.nan_rule(False):
            assert not nan.on()
        assert nan.on()
    finally:
        attnkit.nan_rule(False)
    assert not nan.on()
    with attnkit.nan_rule(True) as rule:
        assert nan.on() and repr(rule) == "nan_rule(True)"
    assert not nan.on()


def test_a_mask_changed_in_place_is_looked_at_again():
    """The empty-row look is kept on the mask with its version: emptying a row in place is seen."""
    q = k = v = torch.randn(1, 2, 6, 8)
    mask = torch.ones(6, 6, dtype=torch.bool)
    before = attnkit.attention(q, k, v, mask=mask, backend="sdpa").output
    assert not (before == 0).all(-1).any()
    mask[2] = False
    after = attnkit.attention(q, k, v, mask=mask, backend="sdpa").output
    assert (after[:, :, 2] == 0).all() and torch.equal(after[:, :, :2], before[:, :, :2])


def test_small_structural_masks_are_kept_per_shape_and_bounded(monkeypatch):
    monkeypatch.setattr(common, "_structures", type(common._structures)())
    q = torch.randn(1, 2, 16, 8)
    for window in range(1, 3 * common.STRUCTURE_CACHE_SIZE):
        got = attnkit.attention(q, q, q, window=window, backend="sdpa").output
        want = attnkit.attention(q, q, q, mask=masks.sliding_window(16, 16, window), backend="sdpa").output
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert len(common._structures) == common.STRUCTURE_CACHE_SIZE


def test_a_block_masks_occupancy_follows_its_table():
    blocks = masks.causal_block_mask(64, block=16)
    first = blocks.occupancy()
    assert first == blocks.occupancy() == 10 / 16
    blocks.kinds = torch.full_like(blocks.kinds, 2)  # a new table: counted again
    assert blocks.occupancy() == 1.0


@pytest.mark.slow
def test_flex_keeps_one_prepared_call_per_pattern_and_score_mod(monkeypatch):
    """Two score_mods on the same structure do not share a prepared call; each equals the reference."""
    monkeypatch.setattr(flex, "COMPILE_ON_CPU", False)
    q = torch.randn(1, 2, 40, 16)

    def double(score, b, h, q_idx, kv_idx):
        return 2 * score

    def capped(score, b, h, q_idx, kv_idx):
        return 5 * torch.tanh(score / 5)

    with torch.no_grad():
        for score_mod in (double, capped, double):
            got = attnkit.attention(q, q, q, window=7, score_mod=score_mod, backend="flex").output
            want = attnkit.attention(q, q, q, window=7, score_mod=score_mod, backend="reference").output
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"window": 3, "need_weights": [1]},
                                    {"mask": masks.padding(torch.tensor([5, 7]), 7)}])
def test_attention_trusted_equals_attention(kwargs):
    q, k, v = torch.randn(2, 4, 7, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 6)
    got, want = attention_trusted(q, k, v, **kwargs), attnkit.attention(q, k, v, **kwargs)
    torch.testing.assert_close(got.output, want.output, rtol=0, atol=0)
    assert (got.weights is None) == (want.weights is None)


@pytest.mark.parametrize("backend", ["auto", "sdpa"])
@pytest.mark.parametrize("kind", ["attnkit", "torch"])
def test_a_full_block_mask_alone_goes_to_sdpa_without_a_problem(backend, kind, monkeypatch):
    """A block mask too full for auto to tile (and any block mask under backend='sdpa') is the dense mask it
    keeps, handed to SDPA without a Problem or routing: the same numbers as the float64 softmax written out,
    rows with no key zero, a NaN poisoning its rows; a sparse one under auto still takes the general path."""
    import importlib

    module = importlib.import_module("attnkit.functional.attention")

    generator = torch.Generator().manual_seed(62)
    L = 24
    allowed = torch.rand(L, L, generator=generator) < 0.7
    allowed[5] = False  # a row with no key
    blocks = masks.BlockMask.from_dense(allowed[None, None], block=8)
    if kind == "torch":
        pytest.importorskip("torch.nn.attention.flex_attention")
        blocks = masks.to_torch_block_mask(blocks)
    q, k, v = (randn(2, 3, L, 16, dtype=torch.float64, generator=generator) for _ in range(3))
    q[1, 2, 7, 0] = float("nan")
    scores = (q @ k.transpose(-1, -2) / 4).masked_fill(~allowed, float("-inf"))
    want = torch.nan_to_num(torch.softmax(scores, -1), nan=0.0) @ v
    want[1, 2, 7] = float("nan")
    calls = []
    monkeypatch.setattr(module, "_problem", lambda *args: calls.append(args) or pytest.fail("built a Problem"))
    got = attnkit.attention(q, k, v, mask=blocks, backend=backend).output
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, equal_nan=True)
    assert (got[:, :, 5] == 0).all()

    monkeypatch.undo()
    real = module._problem
    monkeypatch.setattr(module, "_problem", lambda *args: calls.append(args) or real(*args))
    sparse = masks.causal_block_mask(64, block=8)
    assert sparse.occupancy() <= module.AUTO_TILED_MAX_OCCUPANCY
    q, k, v = (randn(1, 2, 64, 16, dtype=torch.float64, generator=generator) for _ in range(3))
    tiled = attnkit.attention(q, k, v, mask=sparse).output
    assert len(calls) == 1  # auto tiles it: the general path
    torch.testing.assert_close(tiled, F.scaled_dot_product_attention(q, k, v, is_causal=True), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="block mask of shape"):
        attnkit.attention(q[:, :, :32], k, v, mask=sparse)


@pytest.mark.parametrize("L", [3, 16])
def test_a_padded_self_attention_call_gives_the_rules_rows_through_its_packed_projection(L, nan_rule_on):
    """MultiHeadAttention's packed projection with a key mask, the NaN rule on: a NaN in a padded token's input
    poisons every row of its sequence (its key and value are NaN, whatever the mask says), as the layer's unpacked
    call (three tensors) gives, and no row of the other sequence."""
    torch.manual_seed(0)
    layer = attnkit.MultiHeadAttention(32, 4).double().eval()
    x = torch.randn(2, L, 32, dtype=torch.float64)
    key_mask = torch.ones(2, L, dtype=torch.bool)
    key_mask[1, -1] = False
    x[1, L - 1, 5] = float("nan")  # the padded token of the second sequence
    with torch.no_grad():
        packed = layer(x, key_mask=key_mask).output
        unpacked = layer(x, x, x, key_mask=key_mask).output  # separate projections: three tensors
    assert layer._packed_qkv is not None
    torch.testing.assert_close(packed, unpacked, rtol=1e-12, atol=1e-12, equal_nan=True)
    assert packed[1].isnan().all() and not packed[0].isnan().any()


@pytest.mark.parametrize("kind", ["plain", "causal", "padding", "window"])
def test_an_empty_batch_gives_torchs_empty_result(kind, nan_rule_setting):
    """A batch of 0 gives torch's empty result, the NaN rule on (whose maxima an empty tensor has not) or off."""
    q, k, v = (torch.randn(0, 2, n, 16, dtype=torch.float64) for n in (8, 64, 64))
    kwargs = {"plain": {}, "causal": {"is_causal": True, "causal_align": "bottom-right"},
              "padding": {"mask": torch.ones(0, 1, 1, 64, dtype=torch.bool)}, "window": {"window": 4}}[kind]
    out = attnkit.attention(q, k, v, **kwargs).output
    assert out.shape == (0, 2, 8, 16)
