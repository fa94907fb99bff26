"""The NaN rule on CUDA (marker ``gpu``; skipped with the reason on a machine without one).

From ``nan.DEVICE_LOOK_MIN_BYTES`` of q, k and v the rule looks before it acts on CUDA, as on the CPU: one look
at a plain call's output (the premise: SDPA's CUDA kernels carry every NaN of q, k or v into it), or the three
whole-tensor maxima of q, k and v, and one wait. These tests hold:

- the premise, for each of SDPA's CUDA kernels that takes the call (flash, memory-efficient, cuDNN, math) in
  float32, bfloat16 and float16, at every length of the first vectors from ``PLAIN_LOOK_MIN_KEYS`` keys and at
  positions spread over q's rows and k's and v's keys, first, middle and last channels;
- attention() poisons exactly the rule's rows on CUDA, looking first and not: plain, causal, grouped, a decoding
  step, a padding mask hiding the NaN's key, a window;
- above the threshold the look is taken (no ``where`` over the output), and not while a CUDA graph is captured
  or ``set_sync_debug_mode`` hunts waits.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnkit
from attnkit import masks
from attnkit.functional import nan, nan_kernel

CUDA = "cuda"
KERNELS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]
LEAST = nan.PLAIN_LOOK_MIN_KEYS
LENGTHS = sorted({LEAST, LEAST + 1, 2 * LEAST - 1, 2 * LEAST, 2 * LEAST + 1, 4 * LEAST + 1, 1000})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("kernel", KERNELS, ids=lambda kernel: kernel.name.lower())
def test_sdpa_cuda_kernels_carry_every_nan_into_a_plain_calls_output(kernel, dtype):
    """The one look's premise on CUDA: from PLAIN_LOOK_MIN_KEYS keys, a NaN anywhere in q, k or v shows in the
    output of a plain call (not causal; causal with L = S, whose last row sees every key)."""
    generator = torch.Generator(device=CUDA).manual_seed(0)
    cases, seen, refused = [], [], set()
    for S in LENGTHS:
        for causal in (False, True):
            L = S if causal else 3
            base = [torch.randn(1, 2, n, 64, device=CUDA, dtype=dtype, generator=generator) for n in (L, S, S)]
            for i, where in enumerate("qkv"):
                n = base[i].shape[2]
                for position in sorted({*range(0, n, max(1, n // 24)), n - 1}):
                    for channel in (0, 31, 63):
                        q, k, v = (x.clone() for x in base)
                        (q, k, v)[i][0, 1, position, channel] = math.nan
                        try:
                            with sdpa_kernel(kernel):
                                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        except RuntimeError as error:  # this kernel does not take such a call
                            refused.add((S, causal, str(error).splitlines()[0][:80]))
                            continue
                        cases.append((S, causal, where, position, channel))
                        seen.append(out.isnan().any())
    if not cases:
        pytest.skip(f"{kernel.name} takes no plain {dtype} call on this GPU: {sorted(refused)[:2]}")
    missed = [case for case, carried in zip(cases, torch.stack(seen).tolist()) if not carried]
    assert not missed, f"{len(missed)} of {len(cases)} NaNs did not reach the output, e.g. {missed[:5]}"


def _expected(where: str, index: int, B: int, H: int, Hkv: int, L: int) -> torch.Tensor:
    rows = torch.zeros(B, H, L, dtype=torch.bool)
    if where == "q":
        rows[-1, -1, index] = True
    else:
        rows[-1, H - H // Hkv:] = True
    return rows


CALLS = {  # name: (B, H, Hkv, L, S, keyword arguments given S)
    "dense": (2, 4, 4, 80, 96, lambda S: {}),
    "causal": (1, 4, 4, 128, 128, lambda S: {"is_causal": True}),
    "grouped": (2, 8, 2, 70, 70, lambda S: {"is_causal": True}),
    "decoding step": (2, 4, 2, 1, 200, lambda S: {"is_causal": True, "causal_align": "bottom-right"}),
    "short": (1, 2, 2, 5, 7, lambda S: {}),
    "padding hides the key": (2, 4, 4, 16, 96, lambda S: {"mask": masks.padding(torch.tensor([96, 40], device=CUDA), S)}),
    "window": (1, 4, 4, 100, 100, lambda S: {"window": 8}),
}


@pytest.mark.parametrize("way", ["looks-first", "one kernel", "seven kernels"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(CALLS))
def test_attention_on_cuda_poisons_exactly_the_rules_rows(name, dtype, way, monkeypatch):
    monkeypatch.setattr(nan, "DEVICE_LOOK_MIN_BYTES", 0 if way == "looks-first" else math.inf)
    if way == "seven kernels":
        monkeypatch.setattr(nan_kernel, "applies", lambda *args: False)
    elif way == "one kernel":
        pytest.importorskip("triton", reason="the one kernel is Triton's")
    B, H, Hkv, L, S, kwargs = CALLS[name]
    generator = torch.Generator(device=CUDA).manual_seed(3)
    clean = [torch.randn(B, n, m, 64, device=CUDA, dtype=dtype, generator=generator) for n, m in ((H, L), (Hkv, S), (Hkv, S))]
    assert not attnkit.attention(*clean, **kwargs(S)).output.isnan().any()
    for i, where in enumerate("qkv"):
        n = clean[i].shape[2]
        for index in sorted({0, n // 2, n - 1}):
            q, k, v = (x.clone() for x in clean)
            (q, k, v)[i][-1, -1, index, 5] = math.nan  # batch B-1: behind the padding where the mask has one
            out = attnkit.attention(q, k, v, **kwargs(S)).output
            got = out.isnan().any(-1).cpu()
            assert torch.equal(got, _expected(where, index, B, H, Hkv, L)), (where, index)
            assert out[got].isnan().all(), "a poisoned row is NaN throughout"


@pytest.mark.parametrize("masked", [False, True], ids=["plain", "padding"])
@pytest.mark.parametrize("causal", [False, True], ids=["dense", "causal"])
def test_below_the_threshold_one_kernel_stands_for_seven(causal, masked):
    """A tiny call's rule is one Triton kernel (nan_kernel): none of the seven kernels' isnan and where runs, and it
    poisons the rule's row; under autograd the seven kernels run (their where gives the poisoned rows a zero
    gradient)."""
    pytest.importorskip("triton", reason="the one kernel is Triton's")
    kwargs = {"is_causal": causal, **({"mask": masks.padding(torch.tensor([9], device=CUDA), 16)} if masked else {})}
    q, k, v = (torch.randn(1, 4, 16, 32, device=CUDA) for _ in range(3))
    ran = _ops(lambda: attnkit.attention(q, k, v, **kwargs))
    assert "aten::isnan" not in ran, sorted(set(ran))  # the seven kernels' isnan (a mask's path has a where of its own)
    assert masked or "aten::where" not in ran, sorted(set(ran))
    q[0, 2, 3, 1] = math.nan
    rows = attnkit.attention(q, k, v, **kwargs).output.isnan().any(-1)
    assert rows[0, 2, 3] and rows.sum() == 1
    v.requires_grad_(True)
    ran = _ops(lambda: attnkit.attention(q, k, v, **kwargs))
    assert "aten::isnan" in ran, sorted(set(ran))


BIG = (1, 16, 4096, 128)  # bf16: 16 MiB each, 48 MiB of q, k and v


def _big():
    generator = torch.Generator(device=CUDA).manual_seed(5)
    return [torch.randn(*BIG, device=CUDA, dtype=torch.bfloat16, generator=generator) for _ in range(3)]


def _ops(call) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        call()
    return [event.name for event in profile.events()]


@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"window": 256}], ids=["dense", "causal", "window"])
def test_above_the_threshold_the_rule_looks_first_and_rewrites_nothing(kwargs):
    q, k, v = _big()
    assert q.nbytes * 3 >= nan.DEVICE_LOOK_MIN_BYTES
    expected = attnkit.attention(q, k, v, **kwargs).output
    ran = _ops(lambda: attnkit.attention(q, k, v, **kwargs))
    # the kernels' way ends in isnan and where; the look reads a maximum (of the output, or of q, k and v in one
    # foreach call) back to the host (flex's own post-processing may run a where of its own)
    assert "aten::isnan" not in ran and {"aten::amax", "aten::_foreach_max"} & set(ran), sorted(set(ran))
    if "window" not in kwargs:
        assert "aten::where" not in ran, sorted(set(ran))
    with nan.nan_rule(False):
        torch.testing.assert_close(attnkit.attention(q, k, v, **kwargs).output, expected, rtol=0, atol=0)


def test_no_look_while_sync_debug_mode_hunts_waits():
    q, k, v = _big()
    attnkit.attention(q, k, v, is_causal=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = attnkit.attention(q, k, v, is_causal=True).output
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert not out.isnan().any()


def test_a_cuda_graph_captures_a_call_above_the_threshold():
    """A look waits for the device, which capture forbids: the rule runs its kernels inside a graph, and the
    replay poisons the rows of a NaN written into the captured inputs."""
    q, k, v = _big()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        attnkit.attention(q, k, v, is_causal=True)  # warm-up on a side stream, as torch's CUDA graph notes ask
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = attnkit.attention(q, k, v, is_causal=True).output
    graph.replay()
    torch.testing.assert_close(captured, attnkit.attention(q, k, v, is_causal=True).output, rtol=0, atol=0)
    k[0, 3, 100, 7] = math.nan
    graph.replay()
    rows = captured.isnan().any(-1)
    assert rows[0, 3].all() and rows.sum() == BIG[2]
