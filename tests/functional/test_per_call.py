"""What attention() keeps between calls to cost nothing per call, and the shortcuts it takes, each
held to the same numbers as the long way: the one look at a plain call's output for the NaN rule (and
the premise it rests on: SDPA carries every NaN of q, k or v into that output), a mask's empty-row look
kept on the mask (an in-place change looks again), small structural masks kept per shape, a
BlockMask's occupancy, flex's prepared calls, and attention_trusted for the layers."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import attnkit
from attnkit import masks
from attnkit.functional import nan
from attnkit.functional.attention import attention_trusted
from attnkit.functional.backends import _common, flex, sdpa

from helpers import OpsSeen, randn

SHAPES = [(1, 4, 4, 16, 16, 32), (2, 8, 2, 33, 97, 64), (1, 4, 1, 1, 128, 32), (1, 2, 2, 300, 300, 64),
          (1, 2, 2, 128, 40, 16), (1, 2, 2, 64, 64, 8),
          # below a vector's width SDPA's CPU kernels drop a NaN: the rule reads the inputs there
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


def _looked_once(x: torch.Tensor, seen: list[str]) -> bool:
    """Whether nan.holds_nan's one look at the small CPU tensor x is what ran, and no per-row loop (foreach): the
    compiled scan where it is built (no op at all: plain.cpp), else x.equal(x) up to its size and the maximum above."""
    if any("foreach" in op for op in seen):
        return False
    if nan._scan is not None:
        if x.numel() > {torch.float64: 2048, torch.float32: 16384}.get(x.dtype, math.inf):  # plain.cpp: scan_limit
            return "aten.amax.default" in seen
        return "aten.equal.default" not in seen and ("aten.amax.default" not in seen or nan.holds_nan(x))  # (rows)
    return ("aten.equal.default" if x.numel() <= nan._SCANNED_UP_TO[x.dtype] else "aten.amax.default") in seen


# Causal calls with L < S have keys no query sees: the rule reads the inputs there (the test below).
PLAIN_CALLS = [(shape, causal) for shape in SHAPES for causal in (False, True) if not (causal and shape[3] < shape[4])]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape, is_causal", PLAIN_CALLS, ids=[f"{s}-{'causal' if c else 'full'}" for s, c in PLAIN_CALLS])
def test_a_plain_calls_output_carries_every_nan_and_the_rule_gives_its_rows(dtype, shape, is_causal, plain_path):
    """The premise of the one-look NaN rule of a plain call (no mask; not causal, or causal with L >= S;
    at least plain_look_min_keys(dtype) keys): SDPA's CPU kernels carry any NaN of q, k or v into the output;
    and attention() then poisons exactly the rule's rows, at every length (decoding steps with one key
    included, where SDPA returns a finite row for a NaN query). If a PyTorch release stops carrying it,
    this fails before a NaN goes unseen."""
    B, H, Hkv, L, S, E = shape
    for where, index, q, k, v in _one_nan_each(shape, dtype, torch.Generator().manual_seed(1)):
        if S >= nan.plain_look_min_keys(dtype):  # the one look's premise, where the rule takes it
            raw = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=H != Hkv)
            assert torch.isnan(raw).any(), (where, index)
        out = attnkit.attention(q, k, v, is_causal=is_causal).output
        assert torch.equal(out.isnan().any(-1), _expected_nan_rows(where, index, B, H, Hkv, L)), (where, index)


_SWEEP = """
import sys, torch, torch.nn.functional as F
from attnkit.functional import nan
failures = []
for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
    least = nan.plain_look_min_keys(dtype)
    for S in sorted({least, least + 1, 2 * least - 1, 2 * least, 2 * least + 1, 3 * least + 5}):
        generator = torch.Generator().manual_seed(S)
        for is_causal in (False, True):
            L = S if is_causal else 3  # causal: L = S, the last row sees every key
            for where in "qkv":
                n = L if where == "q" else S
                for position in sorted({*range(0, n, max(1, n // 40)), n - 1}):  # every one up to 40, else 40 and the last
                    for channel in (0, 7, 15):
                        q, k, v = (torch.randn(1, 2, n, 16, generator=generator).to(dtype) for n in (L, S, S))
                        {"q": q, "k": k, "v": v}[where][0, 1, position, channel] = float("nan")
                        if not F.scaled_dot_product_attention(q, k, v, is_causal=is_causal).isnan().any():
                            failures.append((str(dtype), S, is_causal, where, position, channel))
print(torch.backends.cpu.get_cpu_capability(), len(failures), failures[:5])
sys.exit(1 if failures else 0)
"""


@pytest.mark.slow
@pytest.mark.parametrize("capability", [None, "avx2"], ids=["this-cpu", "avx2"])
def test_the_one_looks_premise_holds_from_its_threshold_at_every_position(capability):
    """plain_look_min_keys reads the vector unit PyTorch dispatches to; on it, from that many keys on, SDPA
    carries a NaN at every position of q (each row), k and v (each key), first, middle and last channels, into
    the output: every S of the first vectors and their tails, plain and causal (every position up to 40 of them,
    40 spread over longer rows and the last). Run on the CPU that runs the tests, and again with PyTorch's kernels
    held to AVX2 (ATEN_CPU_CAPABILITY); a CPU with other kernels keeps the threshold of 64 keys, which the test
    above checks."""
    import os
    import subprocess
    import sys

    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip(f"this CPU's PyTorch kernels are {torch.backends.cpu.get_cpu_capability()}: the look starts at "
                    f"{nan.PLAIN_LOOK_MIN_KEYS} keys there, the premise the test above checks")
    env = os.environ | ({"ATEN_CPU_CAPABILITY": capability} if capability else {})
    done = subprocess.run([sys.executable, "-c", _SWEEP], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    if capability:
        assert done.stdout.startswith("AVX2 ")


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
def test_a_masked_calls_output_carries_every_nan_and_the_rule_gives_its_rows(dtype, shape):
    """The premise of the one look at a masked call's output (nan.masked_output): SDPA's CPU kernels carry a NaN
    of q, k or v into the output at any length, under every kind of mask, a NaN in a key no query may attend and a
    NaN query whose row has no allowed key included; attention() then poisons exactly the rule's rows. A call
    with no NaN is settled by the look alone where the kernels are known (AVX2, AVX-512)."""
    B, H, Hkv, L, S, E = shape
    generator = torch.Generator().manual_seed(2)
    options = {"dropout_p": 0.0, "scale": E**-0.5, "enable_gqa": H != Hkv}
    for name, mask in _masks(B, L, S, generator).items():
        q, k, v = (randn(B, n, m, E, dtype=dtype, generator=generator) for n, m in ((H, L), (Hkv, S), (Hkv, S)))
        with OpsSeen() as ops:
            clean = attnkit.attention(q, k, v, mask=mask).output
        assert not clean.isnan().any()
        if nan.plain_look_min_keys(dtype) < nan.PLAIN_LOOK_MIN_KEYS:  # a known vector unit: the look alone
            assert _looked_once(clean, ops.seen), name
        for where, index, q, k, v in _one_nan_each(shape, dtype, generator):
            raw = sdpa.masked(q, k, v, mask if isinstance(mask, torch.Tensor) else mask.to_dense(), None, options)
            assert torch.isnan(raw).any(), (name, where, index)
            out = attnkit.attention(q, k, v, mask=mask).output
            expected = _expected_nan_rows(where, index, B, H, Hkv, L)
            assert torch.equal(out.isnan().any(-1), expected), (name, where, index)


_MASKED_SWEEP = """
import sys, torch
from attnkit import masks
from attnkit.functional.backends import sdpa
failures, calls = [], 0
dtypes = [torch.float32, torch.float64] + ([torch.bfloat16, torch.float16] if sys.argv[1] == "all" else [])
for dtype in dtypes:
    for B, H, Hkv, L, S, E in [(2, 4, 2, 9, 11, 8), (2, 4, 2, 33, 97, 16), (1, 4, 1, 1, 128, 32), (1, 2, 2, 3, 5, 16),
                               (1, 2, 1, 1, 1, 8), (2, 2, 2, 16, 16, 32)]:
        generator = torch.Generator().manual_seed(S * 7 + L)
        random = torch.rand(B, 1, L, S, generator=generator) < 0.5
        random[:, :, L // 2] = False
        random[:, :, :, S // 2] = False
        for mask in (masks.padding(torch.tensor([S - 3, 1][:B]).clamp(min=1), S), random,
                     masks.sliding_window(L, S, 3, causal_align="bottom-right")):
            for where in "qkv":
                n = L if where == "q" else S
                for b in range(B):
                    for position in sorted({*range(0, n, max(1, n // 40)), n - 1}):  # every one up to 40
                        for channel in (0, E // 2, E - 1):
                            q = torch.randn(B, H, L, E, generator=generator).to(dtype)
                            k, v = (torch.randn(B, Hkv, S, E, generator=generator).to(dtype) for _ in "kv")
                            {"q": q, "k": k, "v": v}[where][b, -1, position, channel] = float("nan")
                            out = sdpa.masked(q, k, v, mask, None, {"dropout_p": 0.0, "scale": E**-0.5,
                                                                    "enable_gqa": H != Hkv})
                            calls += 1
                            if not out.isnan().any():
                                failures.append((str(dtype), B, H, Hkv, L, S, E, where, b, position, channel))
print(torch.backends.cpu.get_cpu_capability(), calls, len(failures), failures[:5])
sys.exit(1 if failures or not calls else 0)
"""


@pytest.mark.slow
@pytest.mark.parametrize("capability", [None, "avx2"], ids=["this-cpu", "avx2"])
def test_the_masked_looks_premise_holds_at_every_position(capability):
    """The masked look's premise at every position of q (each row), k and v (each key) up to 40 of them, of each
    sequence, first, middle and last channels, under a padding mask, a random one (an empty row, a key nobody
    attends) and a causal window, at lengths from 1 key on: on the CPU that runs the tests (every dtype) and with
    PyTorch's kernels held to AVX2 (float32 and float64: its half-precision masked kernels need AVX-512 there,
    "pack_vnni2 is only supported when avx512 is supported")."""
    import os
    import subprocess
    import sys

    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip(f"this CPU's PyTorch kernels are {torch.backends.cpu.get_cpu_capability()}: the rule reads the "
                    "inputs of a masked call there")
    env = os.environ | ({"ATEN_CPU_CAPABILITY": capability} if capability else {})
    dtypes = "all" if capability is None and torch.backends.cpu.get_cpu_capability() == "AVX512" else "float"
    done = subprocess.run([sys.executable, "-c", _MASKED_SWEEP, dtypes], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    if capability:
        assert done.stdout.startswith("AVX2 ")


def test_causal_with_fewer_queries_than_keys_reads_the_inputs(plain_path):
    """A NaN at a key no query of a causal top-left call sees (L < S): the output shows nothing, the
    rule (which reads q, k, v there) still poisons the key head's rows."""
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    k[0, 1, 8, 0] = float("nan")
    assert not F.scaled_dot_product_attention(q, k, v, is_causal=True).isnan().any()
    out = attnkit.attention(q, k, v, is_causal=True).output
    assert out[0, 1].isnan().all() and not out[0, 0].isnan().any()


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
    monkeypatch.setattr(_common, "_structures", type(_common._structures)())
    q = torch.randn(1, 2, 16, 8)
    for window in range(1, 3 * _common.STRUCTURE_CACHE_SIZE):
        got = attnkit.attention(q, q, q, window=window, backend="sdpa").output
        want = attnkit.attention(q, q, q, mask=masks.sliding_window(16, 16, window), backend="sdpa").output
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert len(_common._structures) == _common.STRUCTURE_CACHE_SIZE


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


def test_the_rule_looks_first_on_the_cpu_and_not_while_compiling_or_on_other_devices(monkeypatch):
    """nan.looks_first: the CPU looks (one dispatch and a wait for nothing); compiled code never (a look is a
    graph break); a device that is neither the CPU nor CUDA never (tests/gpu/test_nan_rule_cuda.py holds CUDA's
    threshold, graph capture and sync-debug mode)."""
    q = torch.randn(1, 2, 4, 8)
    assert nan.looks_first(q, q, q)
    meta = q.to("meta")
    assert not nan.looks_first(meta, meta, meta)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not nan.looks_first(q, q, q)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
def test_the_look_for_a_nan_scans_small_tensors_and_reduces_large_ones_with_one_answer(dtype, monkeypatch):
    """nan.holds_nan without the compiled scan: True exactly where a NaN is, at the first, a middle and the last
    element, in a contiguous tensor and in the transposed output a layer's SDPA returns, on both sides of the size
    where the scan (torch.equal(x, x), False exactly where x holds a NaN) gives way to the maximum; infinities of
    either sign are no NaN. Each side is seen taken."""
    monkeypatch.setattr(nan, "_scan", None)
    largest = nan._SCANNED_UP_TO[dtype]
    calls = {"equal": 0, "amax": 0}
    for name in calls:
        real = getattr(torch.Tensor, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, counted)
    for numel in (1, largest, largest + 4):
        for layout in ("contiguous", "transposed"):
            rows = max(numel // 4, 1)
            x = torch.randn(rows, numel // rows).to(dtype)
            if layout == "transposed":  # the same elements, held column by column
                x = x.t().contiguous().t()
            assert not nan.holds_nan(x)
            for index in sorted({0, x.numel() // 2, x.numel() - 1}):
                at = divmod(index, x.shape[1])
                for value, expected in ((math.inf, False), (-math.inf, False), (math.nan, True)):
                    y = x.clone() if layout == "contiguous" else x.t().clone().t()
                    y[at] = value
                    assert nan.holds_nan(y) is expected, (numel, layout, index, value)
    assert calls["equal"] and calls["amax"]


def _packed(B: int, L: int, H: int, Hkv: int, E: int, base: torch.Tensor | None = None):
    """q (B, H, L, E), k and v (B, Hkv, L, E) as a layer's packed projection splits them: views of one
    (B, L, (H + 2 Hkv) E) tensor."""
    base = torch.randn(B, L, (H + 2 * Hkv) * E, dtype=torch.float64) if base is None else base
    heads = base.view(B, L, H + 2 * Hkv, E).transpose(1, 2)
    return base, heads.split_with_sizes((H, Hkv, Hkv), 1)


@pytest.mark.parametrize("where", ["none", "q", "k", "v"])
@pytest.mark.parametrize("H, Hkv", [(4, 4), (4, 2)])
def test_views_of_one_packed_tensor_are_looked_at_once_with_the_rows_of_their_copies(where, H, Hkv):
    """nan.poisoned_rows reads q, k and v that are views of one tensor no larger than they are (a packed self
    attention projection) by one look at that tensor, and gives the rows it gives their copies."""
    B, L, E = 2, 5, 8
    base, (q, k, v) = _packed(B, L, H, Hkv, E)
    part = {"q": q, "k": k, "v": v}.get(where)
    if part is not None:
        part[-1, -1, 2, 3] = float("nan")  # through the view, into the shared tensor
    assert nan.shared_base(q, k, v) is base
    dims = attnkit.functional.checks.check_qkv(q, k, v)
    with OpsSeen() as ops:
        got = nan.poisoned_rows(q, k, v, dims)
    assert _looked_once(base, ops.seen)
    want = nan.poisoned_rows(q.clone(), k.clone(), v.clone(), dims)
    if where == "none":
        assert got is None and want is None
    else:
        assert torch.equal(got, want) and got.any()


def test_a_larger_or_missing_base_is_not_looked_at_and_overlapping_views_stay_exact():
    """A NaN in the part of a wider tensor that q, k and v do not cover poisons nothing (the three are read
    themselves); q, k and v that are one view (together more than their base) are read through the base and the
    rows are the rule's; inference tensors keep no base, and the three maxima answer."""
    B, L, H, E = 1, 4, 2, 8
    wide = torch.randn(B, L, 4 * H * E, dtype=torch.float64)
    wide[..., -1] = float("nan")  # beyond q, k and v
    sliced = wide.view(B, L, 4 * H, E).transpose(1, 2)[:, : 3 * H].split_with_sizes((H, H, H), 1)
    assert nan.shared_base(*sliced) is None  # the base holds a quarter more than the three views
    dims = attnkit.functional.checks.check_qkv(*sliced)
    assert nan.poisoned_rows(*sliced, dims) is None
    _, (q, _, _) = _packed(B, L, H, H, E)
    q[0, 0, 1, 0] = float("nan")
    assert nan.shared_base(q, q, q) is q._base
    rows = nan.poisoned_rows(q, q, q, dims)
    assert torch.equal(rows, nan.poisoned_rows(q.clone(), q.clone(), q.clone(), dims))
    assert rows[:, 0].all() and not rows[:, 1].any()  # the NaN's head, as key and value too
    with torch.inference_mode():
        _, (qi, ki, vi) = _packed(B, L, H, H, E)
        assert nan.shared_base(qi, ki, vi) is None
        assert nan.poisoned_rows(qi, ki, vi, dims) is None


@pytest.mark.parametrize("L", [3, 16])
def test_a_padded_self_attention_call_gives_the_rules_rows_through_its_packed_projection(L):
    """MultiHeadAttention's packed projection with a key mask (and, at L = 3, below the one look's threshold): a
    NaN in a padded token's input poisons every row of its sequence (its key and value are NaN, whatever the mask
    says), as the layer's unpacked call (three tensors, three maxima) gives, and no row of the other sequence.
    (The rows of the look itself are held in the two tests above.)"""
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
def test_the_one_look_takes_an_empty_batch(kind, plain_path):
    """The look reads a maximum of the output, which an empty one has not (amax raised on AVX2 machines, where a
    6-key float64 call is long enough to look; 64 keys here reach it on AVX-512 too): a batch of 0 gives torch's
    empty result."""
    q, k, v = (torch.randn(0, 2, n, 16, dtype=torch.float64) for n in (8, 64, 64))
    kwargs = {"plain": {}, "causal": {"is_causal": True, "causal_align": "bottom-right"},
              "padding": {"mask": torch.ones(0, 1, 1, 64, dtype=torch.bool)}, "window": {"window": 4}}[kind]
    out = attnkit.attention(q, k, v, **kwargs).output
    assert out.shape == (0, 2, 8, 16)
