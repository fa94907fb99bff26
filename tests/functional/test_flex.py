"""The flex backend on the CPU: attnkit's semantics through PyTorch's FlexAttention.

- every case x masking x dtype of the oracle grid, block masks, score_mods and sinks against the
  float64 oracle, through flex's eager implementation (no compile: the semantics of the mask_mod and
  score_mod attnkit hands over);
- the tile tables attnkit writes against the tables PyTorch's own ``create_block_mask`` computes for
  the same mask (code nobody here wrote);
- a few calls through the compiled CPU forward (the tables at work: full tiles skip the mask), and
  the compile count over a loop of varying lengths;
- ``auto`` on CUDA routes to flex / SDPA and never to the tiled loop (routing is decided from the
  call's description, so it is tested here; tests/gpu runs it on a GPU).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

import attnkit
from attnkit import masks
from attnkit.functional.attention import choose_backend
from attnkit.functional.backends import flex, flex_tables
from attnkit.functional.backends.common import Problem
from attnkit.functional.block_mask import length_bucket
from attnkit.functional.checks import Dims

from helpers import DTYPES, assert_close, numpy, randn, slow
from test_attention import CASES, MASKINGS, make_call, oracle

pytestmark = pytest.mark.skipif(not flex.available(), reason="this PyTorch has no usable FlexAttention")


@pytest.fixture
def eager(monkeypatch):
    monkeypatch.setattr(flex, "COMPILE_ON_CPU", False)


def _check(result, expected, dtype):
    out, weights, lse = expected
    assert_close(result.output, out, dtype, "output")
    if result.weights is not None:
        assert_close(result.weights, weights, dtype, "weights")
    if result.lse is not None:
        got = numpy(result.lse)
        assert (np.isneginf(got) == np.isneginf(lse)).all(), "lse is -inf exactly on fully masked rows"
        finite = np.isfinite(lse)
        assert np.allclose(got[finite], lse[finite], rtol=1e-5, atol=1e-5)


# float32 in the quick tier; float64 and bf16 (each traces anew) join the slow tests.
TIERED_DTYPES = [dtype if dtype == torch.float32 else slow(dtype) for dtype in DTYPES]


# The quick tier runs GQA with L != S; the other cases join the slow tests.
TIERED_CASES = [case if case == "gqa-33x97" else slow(case) for case in CASES]


# Each masking traces flex anew (about 0.4 s): the quick tier keeps no mask, a padding mask and a bias with one.
QUICK_MASKINGS = ("none", "padding", "bias+padding")


@pytest.mark.parametrize("masking", [m if m in QUICK_MASKINGS else slow(m) for m in MASKINGS])
@pytest.mark.parametrize("case", TIERED_CASES)
@pytest.mark.parametrize("dtype", TIERED_DTYPES, ids=str)
def test_flex_matches_float64_oracle(dtype, case, masking, rng, eager):
    q, k, v, kwargs = make_call(case, masking, dtype, rng)
    result = attnkit.attention(q, k, v, backend="flex", need_weights=True, **kwargs)
    assert result.output.dtype == dtype and result.lse is not None
    _check(result, oracle(q, k, v, kwargs), dtype)


@pytest.mark.parametrize("masking", ["none", "causal-bottom-right", "window-top-left", "padding", "bias+padding"])
@pytest.mark.parametrize("dtype", TIERED_DTYPES, ids=str)
def test_flex_with_sinks_matches_oracle(dtype, masking, rng, eager):
    q, k, v, kwargs = make_call("gqa-33x97", masking, dtype, rng)
    kwargs["sinks"] = randn(6, dtype=dtype, generator=rng)
    result = attnkit.attention(q, k, v, backend="flex", need_weights=True, **kwargs)
    _check(result, oracle(q, k, v, kwargs), dtype)


PATTERNS = {
    "longformer": lambda L: masks.longformer_mod(24, torch.arange(L) % 41 == 0),
    "documents": lambda L: masks.document_mod(torch.arange(L) * 3 // L),
    "bigbird": lambda L: masks.bigbird_mod(L, block=16, random_blocks=2),
    "prefix-lm": lambda L: masks.prefix_lm_mod(torch.tensor([10, 40])),
}


@pytest.mark.parametrize("block", [slow(b) if b != 48 else b for b in (16, (32, 64), 128, 48)])
@pytest.mark.parametrize("name", [name if i == 0 else slow(name) for i, name in enumerate(PATTERNS)])
def test_flex_with_block_masks_matches_oracle(name, block, rng, eager):
    """Any attnkit block size: tiles dividing 128 are merged from attnkit's table, others reclassified."""
    B, H, L = 2, 4, 200
    q, k, v = (randn(B, H, L, 32, dtype=torch.float64, generator=rng) for _ in range(3))
    mod = PATTERNS[name](L)
    blocks = masks.block_mask(mod, B, None, L, L, block=block)
    for kwargs in ({"mask": blocks}, {"mask": blocks, "is_causal": True},
                   {"mask": blocks, "score_mod": lambda s, b, h, qi, ki: s - 0.1 * (h + 1) * (qi - ki).abs()}):
        result = attnkit.attention(q, k, v, backend="flex", need_weights=[1, 3], **kwargs)
        want = attnkit.attention(q, k, v, backend="reference", need_weights=[1, 3], **kwargs)
        torch.testing.assert_close(result.output, want.output, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(result.weights, want.weights, rtol=1e-10, atol=1e-10)


def _flex_tables(block_mask):
    """(partial, full) dense boolean tile grids of a torch BlockMask."""
    import inspect

    from torch.nn.attention.flex_attention import _ordered_to_dense

    takes_width = len(inspect.signature(_ordered_to_dense).parameters) > 2  # (torch 2.11's takes none: its indices')

    def dense(num_blocks, indices, width):
        grid = _ordered_to_dense(num_blocks, indices, width) if takes_width else _ordered_to_dense(num_blocks, indices)
        return grid[..., :width].bool()

    num_k = -(-block_mask.seq_lengths[1] // block_mask.BLOCK_SIZE[1])
    partial = dense(block_mask.kv_num_blocks, block_mask.kv_indices, num_k)
    full = dense(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, num_k)
    q_partial = dense(block_mask.q_num_blocks, block_mask.q_indices, -(-block_mask.seq_lengths[0] // block_mask.BLOCK_SIZE[0]))
    return partial, full, q_partial


@pytest.mark.parametrize("name", ["longformer", "documents", "causal", "sinks", "prefix-lm", "bigbird"])
def test_tables_equal_pytorch_create_block_mask(name):
    """attnkit's tables, converted, are the tables torch computes itself for the same mask_mod."""
    L = 1000
    options = {"width": 200} if name == "longformer" else {"window": 200} if name == "sinks" else {}
    blocks = masks.pattern_block_mask(name, L, **options)
    kinds = flex_tables.tile_kinds(blocks)
    ours = flex.flex_block_mask(kinds, (L, L), blocks.mask_mod)
    theirs = create_block_mask(blocks.mask_mod, None, None, L, L, device="cpu", BLOCK_SIZE=flex.BLOCK)
    for got, want in zip(_flex_tables(ours), _flex_tables(theirs)):
        assert torch.equal(got, want)
    assert torch.equal(ours.kv_num_blocks, theirs.kv_num_blocks)
    assert torch.equal(ours.full_kv_num_blocks, theirs.full_kv_num_blocks)


@pytest.mark.slow
def test_flex_never_materialises_a_block_mask(rng, eager, monkeypatch):
    """The block mask reaches flex as its table and its mask_mod: attnkit's tile() and to_dense(),
    which build boolean tiles, are never called."""
    B, H, L = 1, 2, 300
    q, k, v = (randn(B, H, L, 32, generator=rng) for _ in range(3))
    blocks = masks.pattern_block_mask("longformer", L, width=64)
    want = attnkit.attention(q, k, v, backend="reference", mask=blocks).output
    for name in ("tile", "to_dense"):
        monkeypatch.setattr(masks.BlockMask, name, lambda *a, **k: pytest.fail("materialised"))
    got = attnkit.attention(q, k, v, backend="flex", mask=blocks).output
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_flex_refusals(rng, eager):
    q, k, v = (randn(1, 2, 16, 8, generator=rng) for _ in range(3))
    with pytest.raises(ValueError, match="no attention dropout"):
        attnkit.attention(q, k, v, backend="flex", dropout_p=0.1)
    q.requires_grad_()
    with pytest.raises(ValueError, match="no gradients on the CPU"):
        attnkit.attention(q, k, v, backend="flex")
    with torch.no_grad():  # inference is fine
        attnkit.attention(q, k, v, backend="flex")


def test_buckets():
    assert [length_bucket(n) for n in (1, 2, 3, 100, 128, 129, 512)] == [1, 2, 4, 128, 128, 256, 512]
    assert [length_bucket(n) for n in (513, 640, 641, 1000, 4096, 5000)] == [640, 640, 768, 1024, 4096, 5120]
    for n in range(1, 5000, 7):  # padding: under 2x up to 512, at most 25% beyond; few buckets
        assert n <= length_bucket(n) < 2 * n if n <= 512 else n <= length_bucket(n) <= 1.25 * n
    assert len({length_bucket(n) for n in range(513, 1 << 20)}) == 4 * 11


@pytest.mark.slow
def test_compiled_cpu_forward_matches_oracle_and_compiles_once_per_bucket(rng):
    """The compiled CPU kernel uses the tables (full tiles skip the mask): right numbers at lengths
    that need padding, and lengths of one bucket share one compile."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    H = 4
    blocks_for = {L: masks.pattern_block_mask("longformer", L, width=64) for L in (300, 350, 384, 700)}
    compiles = []
    with torch.no_grad():
        for L in (300, 350, 384, 700):
            q, k, v = (randn(1, H, L, 32, generator=rng) for _ in range(3))
            for kwargs in ({"window": 50}, {"mask": blocks_for[L]}):
                before = counters["stats"]["unique_graphs"]
                got = attnkit.attention(q, k, v, backend="flex", **kwargs)
                compiles.append(counters["stats"]["unique_graphs"] - before)
                want = attnkit.attention(q, k, v, backend="reference", **kwargs)
                torch.testing.assert_close(got.output, want.output, rtol=2e-5, atol=2e-5)
    # 300, 350 and 384 share the 512 bucket; 700 is in the 768 bucket: one compile per pattern each.
    assert compiles == [1, 1, 0, 0, 0, 0, 1, 1]


def _problem(**kwargs) -> Problem:
    L, S = kwargs.pop("L", 4096), kwargs.pop("S", 4096)
    return Problem(dims=Dims(B=1, H=8, Hkv=8, L=L, S=S, E=64, Ev=64), scale=0.125, device=torch.device("cuda"),
                   dtype=kwargs.pop("dtype", torch.bfloat16), **kwargs)


def test_auto_on_cuda_routes_to_fused_kernels_only(monkeypatch):
    import importlib

    routing = importlib.import_module("attnkit.functional.routing")
    probe = routing.score_mod_needs_grad  # runs on the call's device: here the CPU stands in
    monkeypatch.setattr(routing, "score_mod_needs_grad", lambda mod, device: probe(mod, "cpu"))
    blocks = masks.pattern_block_mask("longformer", 4096)
    assert choose_backend(_problem()) == "sdpa"
    assert choose_backend(_problem(is_causal=True)) == "sdpa"
    assert choose_backend(_problem(mask=torch.ones(4096, 4096, dtype=torch.bool))) == "sdpa"
    assert choose_backend(_problem(is_causal=True, window=1024)) == "flex"
    assert choose_backend(_problem(block_mask=blocks)) == "flex"
    assert choose_backend(_problem(score_mod=lambda s, b, h, q, k: s)) == "flex"
    assert choose_backend(_problem(sinks=torch.zeros(8))) == "flex"
    assert choose_backend(_problem(L=4096, S=8192, is_causal=True, causal_align="bottom-right")) == "flex"
    assert choose_backend(_problem(L=1, S=8192, is_causal=True, causal_align="bottom-right")) == "sdpa"
    # Small calls, decoding steps among them, keep SDPA with the mask materialised; a score_mod does not.
    assert choose_backend(_problem(L=1, S=8192, is_causal=True, window=1024, causal_align="bottom-right")) == "sdpa"
    small = masks.pattern_block_mask("longformer", 1024)
    assert choose_backend(_problem(L=1024, S=1024, block_mask=small)) == "sdpa"
    assert choose_backend(_problem(L=1, S=8192, score_mod=lambda s, b, h, q, k: s)) == "flex"
    # What flex cannot do exactly goes where it can: dropout, float64, learned biases.
    assert choose_backend(_problem(is_causal=True, window=1024, dropout_p=0.1)) == "sdpa"
    assert choose_backend(_problem(block_mask=blocks, dtype=torch.float64)) == "sdpa"
    assert choose_backend(_problem(score_mod=lambda s, b, h, q, k: s, dtype=torch.float64)) == "reference"
    odd = Problem(dims=Dims(B=1, H=8, Hkv=8, L=4096, S=4096, E=59, Ev=59), scale=0.1, device=torch.device("cuda"),
                  dtype=torch.bfloat16, window=1024)
    assert choose_backend(odd) == "sdpa"
    learned = torch.zeros(8, requires_grad=True)
    assert choose_backend(_problem(score_mod=lambda s, b, h, q, k: s + learned[h])) == "reference"
    for problem in (_problem(is_causal=True, window=1024), _problem(block_mask=blocks), _problem()):
        assert choose_backend(problem) != "tiled"
    # The CPU rules are unchanged.
    assert choose_backend(Problem(dims=Dims(1, 8, 8, 16384, 16384, 64, 64), scale=0.125, window=256)) == "tiled"


def test_mask_mod_tables_are_bucketed_and_refused_beyond_their_length():
    """attnkit's mask_mods pad the tables they read to a length bucket (one compile serves lengths
    300 to 512), and a block mask longer than those tables is refused instead of reading padding."""
    mod = masks.document_mod(torch.arange(300) // 100)
    assert mod.positions == 300
    combined = masks.and_masks(mod, masks.causal_mod())
    for m in (mod, combined):
        with pytest.raises(ValueError, match="reads tables of 300 positions but the block mask has L=400"):
            masks.block_mask(m, None, None, 400, 400)
    masks.block_mask(combined, None, None, 300, 300)


@pytest.mark.slow
def test_tables_are_converted_once_per_block_mask_and_length(rng, eager, monkeypatch):
    """The layers of a model share one block mask: its tables are converted on the first call only;
    a boolean mask (a new tensor each call) is converted every time."""
    built = []
    real = flex_tables.tables
    monkeypatch.setattr(flex_tables, "tables", lambda *a: built.append(1) or real(*a))
    q, k, v = (randn(1, 2, 300, 32, generator=rng) for _ in range(3))
    blocks = masks.pattern_block_mask("documents", 300)
    for _ in range(3):
        attnkit.attention(q, k, v, backend="flex", mask=blocks)
    assert len(built) == 1
    for _ in range(2):
        attnkit.attention(q, k, v, backend="flex", window=17, causal_align="bottom-right")
    assert len(built) == 2
    for _ in range(2):
        attnkit.attention(q, k, v, backend="flex", mask=torch.ones(300, 300, dtype=torch.bool))
    assert len(built) == 4


@pytest.mark.slow
def test_compiled_cpu_forward_with_every_part_at_a_padded_length(rng):
    """Per-example block mask (B = 2 tables), a padding mask, a bias, a score_mod and GQA, at a length
    padded from 300 to 512: the compiled kernel reads the tables per example and the lookups clamp."""
    B, H, Hkv, L = 2, 4, 2, 300
    q = randn(B, H, L, 32, generator=rng)
    k, v = (randn(B, Hkv, L, 32, generator=rng) for _ in range(2))
    ids = torch.stack([torch.arange(L) * 3 // L, torch.arange(L) * 5 // L])
    blocks = masks.document_block_mask(ids)
    kwargs = {"mask": blocks, "bias": randn(1, H, L, L, generator=rng),
              "score_mod": lambda s, b, h, qi, ki: s - 0.01 * (qi - ki).abs()}
    with torch.no_grad():
        got = attnkit.attention(q, k, v, backend="flex", **kwargs).output
    want = attnkit.attention(q.double(), k.double(), v.double(), backend="reference",
                             **{**kwargs, "bias": kwargs["bias"].double()}).output
    torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=2e-5)
    padding = masks.padding(torch.tensor([L, 200]), L)
    with torch.no_grad():
        got = attnkit.attention(q, k, v, backend="flex", mask=padding, is_causal=True).output
    want = attnkit.attention(q.double(), k.double(), v.double(), backend="reference", mask=padding, is_causal=True).output
    torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=2e-5)


def test_a_short_query_block_the_decoding_kernel_cannot_take_compiles_the_main_kernel(monkeypatch, rng):
    """Inductor's "NoValidChoicesError" for FlexAttention's decoding kernel (an H100, torch 2.11, float32,
    64 queries of 8 heads over 2 key heads) makes the call compile the main kernel instead, remembered; the
    same error on a long query block (no decoding kernel involved) propagates."""
    calls = []

    def fake(q, k, v, **options):
        calls.append(options.get("kernel_options"))
        if "kernel_options" not in options:
            raise RuntimeError("LoweringException: NoValidChoicesError: No choices to select. target: flex_attention")
        return torch.zeros_like(q)

    monkeypatch.setattr(flex, "_compiled", lambda: fake)
    monkeypatch.setattr(flex, "_fallbacks", {})
    options = dict(score_mod=None, block_mask=None, scale=None, enable_gqa=True)
    q = torch.randn(1, 8, 64, 32, generator=rng)
    k = v = torch.randn(1, 2, 64, 32, generator=rng)
    flex._run_compiled(q, k, v, options)
    flex._run_compiled(q, k, v, options)
    assert calls == [None, flex.MAIN_KERNEL, flex.MAIN_KERNEL]
    long_q = torch.randn(1, 8, 256, 32, generator=rng)
    with pytest.raises(RuntimeError, match="NoValidChoicesError"):
        flex._run_compiled(long_q, k, v, options)


def test_a_pattern_too_big_for_shared_memory_compiles_again_with_small_tiles(monkeypatch, rng):
    """Triton's "out of resource: shared memory" (an H100, a bias in bf16) makes the compiled call
    retry once with SMALL_TILES, remembered for the pattern; any other compile error propagates."""
    calls = []

    def fake(q, k, v, **options):
        calls.append(options.get("kernel_options"))
        if "kernel_options" not in options:
            raise RuntimeError("No valid triton configs. OutOfMemoryError: out of resource: triton_tem_fused_flex_"
                               "attention_0 Required: 311296 Hardware limit:232448")
        return torch.zeros_like(q)

    monkeypatch.setattr(flex, "_compiled", lambda: fake)
    monkeypatch.setattr(flex, "_fallbacks", {})
    q, k, v = (torch.randn(1, 2, 8, 16, generator=rng) for _ in range(3))
    options = dict(score_mod=None, block_mask=None, scale=None, enable_gqa=False)
    flex._run_compiled(q, k, v, options)
    assert calls == [None, flex.SMALL_TILES]
    flex._run_compiled(q, k, v, options)  # remembered: straight to the small tiles
    assert calls == [None, flex.SMALL_TILES, flex.SMALL_TILES]
    def broken(q, k, v, **options):
        raise RuntimeError("another compile error")

    monkeypatch.setattr(flex, "_compiled", lambda: broken)
    with pytest.raises(RuntimeError, match="another compile error"):
        flex._run_compiled(q, k, v, {**options, "score_mod": lambda s, b, h, i, j: s})


def test_past_the_recompile_limit_the_error_is_attnkits(monkeypatch, rng):
    """torch's FailOnRecompileLimitHit, raised inside the compiled call, reaches the user as
    FlexRecompileLimit with what to do about it."""
    def limited(q, k, v, **options):
        raise torch._dynamo.exc.FailOnRecompileLimitHit("recompile_limit reached")

    monkeypatch.setattr(flex, "_compiled", lambda: limited)
    q = torch.randn(1, 2, 8, 16, generator=rng)
    with pytest.raises(flex.FlexRecompileLimit, match="recompile limit.*recompile_limit, or use backend="):
        flex._run_compiled(q, q, q, dict(score_mod=None, block_mask=None, scale=None, enable_gqa=False))


def test_float64_on_the_cpu_runs_flex_eager_implementation(rng):
    """PyTorch's compiled CPU FlexAttention takes no float64: attnkit runs flex's eager implementation
    for it (compiled stays on) and matches the oracle."""
    assert flex.COMPILE_ON_CPU
    q, k, v, kwargs = make_call("gqa-33x97", "window-bottom-right", torch.float64, rng)
    with torch.no_grad():
        result = attnkit.attention(q, k, v, backend="flex", **kwargs)
    _check(result, oracle(q, k, v, kwargs), torch.float64)


@pytest.mark.slow
def test_a_learned_score_mod_is_refused_by_name_on_the_cpu(rng):
    q, k, v = (randn(1, 2, 16, 8, generator=rng) for _ in range(3))
    table = torch.randn(2, requires_grad=True)

    def learned(score, b, h, q_idx, kv_idx):
        return score + table[h]

    with pytest.raises(ValueError, match="score_mod reads tensors that require gradients.*'reference'"):
        attnkit.attention(q, k, v, backend="flex", score_mod=learned)
    with torch.no_grad():  # inference is fine, and equals the reference
        got = attnkit.attention(q, k, v, backend="flex", score_mod=learned).output
        want = attnkit.attention(q, k, v, backend="reference", score_mod=learned).output
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block", [3, 48, (4, 3)])
def test_a_block_mask_whose_tiles_do_not_divide_flexs_works_after_it_was_materialised(block, rng, eager):
    """A BlockMask that to_dense() cached (any reference or sdpa call does) keeps working in flex, whose
    128-wide tiles its block size does not divide."""
    L = 20
    q, k, v = (randn(1, 2, L, 16, generator=rng) for _ in range(3))
    blocks = masks.block_mask(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx, None, None, L, L, block=block)
    want = attnkit.attention(q, k, v, backend="reference", mask=blocks).output  # caches the dense mask
    assert blocks._dense is not None and blocks.mask_mod is not None
    got = attnkit.attention(q, k, v, backend="flex", mask=blocks).output
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
