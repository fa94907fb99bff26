"""The NaN rule on CUDA (marker ``gpu``; skipped with the reason on a machine without one).

By default attention() returns what its kernel returns and waits for nothing: a call under
``torch.cuda.set_sync_debug_mode("error")`` passes, and runs no isnan or where of the rule. With the rule on
(``attnkit.nan_rule(True)``) every call poisons exactly the rule's rows, without a wait either, and inside a
captured CUDA graph.
"""

from __future__ import annotations

import math

import pytest
import torch

import attnkit
from attnkit import masks

CUDA = "cuda"


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(CALLS))
def test_with_the_rule_on_attention_on_cuda_poisons_exactly_its_rows(name, dtype, nan_rule_on):
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


def _ops(call) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        call()
    return [event.name for event in profile.events()]


@pytest.mark.parametrize("rule", [False, True], ids=["default", "nan_rule_on"])
@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"window": 256}], ids=["dense", "causal", "window"])
def test_no_call_waits_for_the_device(kwargs, rule):
    """Under set_sync_debug_mode("error") a call that waited would raise: neither the default nor the rule waits.
    By default no isnan of the rule runs."""
    generator = torch.Generator(device=CUDA).manual_seed(5)
    q, k, v = (torch.randn(1, 16, 4096, 128, device=CUDA, dtype=torch.bfloat16, generator=generator) for _ in range(3))
    with attnkit.nan_rule(rule):
        attnkit.attention(q, k, v, **kwargs)  # what is kept per shape is built
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = attnkit.attention(q, k, v, **kwargs).output
        finally:
            torch.cuda.set_sync_debug_mode("default")
        ran = _ops(lambda: attnkit.attention(q, k, v, **kwargs))
    assert ("aten::isnan" in ran) == rule, sorted(set(ran))
    assert not out.isnan().any()


def test_a_cuda_graph_captures_a_call_with_the_rule_on(nan_rule_on):
    """The rule reads nothing on the host, so it is captured: the replay poisons the rows of a NaN written into the
    captured inputs."""
    generator = torch.Generator(device=CUDA).manual_seed(5)
    q, k, v = (torch.randn(1, 16, 4096, 128, device=CUDA, dtype=torch.bfloat16, generator=generator) for _ in range(3))
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
    assert rows[0, 3].all() and rows.sum() == q.shape[2]
