"""The functional core on CUDA (marker ``gpu``; skipped with the reason on a machine without one).

- every backend against the float64 oracle over the CPU grid's cases and maskings, in float32,
  bfloat16 and float16 (flex on one case per masking: each new pattern compiles);
- gradients of flex (windows, block masks, score_mod, sinks, fully masked rows) against float64
  autograd of the reference;
- ``auto`` never runs the tiled loop and never synchronises with the host, forward or backward
  (``torch.cuda.set_sync_debug_mode("error")``);
- lengths of one bucket share one compile;
- closed-form block masks at a million tokens on the GPU: < 1 s and < 256 MB.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.bench.harness import peak_extra_mb
from attnkit.functional.backends import tiled
from attnkit.functional.block_patterns import document_block_mask, document_ids, longformer_block_mask

sys.path.insert(0, str(Path(__file__).parents[1] / "functional"))
from helpers import numpy, randn  # noqa: E402
from test_attention import CASES, MASKINGS, make_call, oracle  # noqa: E402

CUDA = "cuda"
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1.6e-2, 1.6e-2), torch.float16: (4e-3, 4e-3)}


def _to_cuda(q, k, v, kwargs):
    moved = {name: value.to(CUDA) if isinstance(value, torch.Tensor) else value for name, value in kwargs.items()}
    return q.to(CUDA), k.to(CUDA), v.to(CUDA), moved


def _close(actual, expected, dtype, what):
    rtol, atol = TOLERANCES[dtype]
    got = numpy(actual)
    assert not np.isnan(got).any(), f"{what}: NaN"
    error = np.abs(got - expected)
    assert (error <= atol + rtol * np.abs(expected)).all(), f"{what}: max error {error.max():.3g}"


# flex compiles per pattern, so it runs one case (GQA, L != S) per masking; the other backends run
# every case. The grid leaves the other flex combinations out instead of skipping them.
GRID = [(backend, case) for backend in ("sdpa", "flex", "auto", "reference") for case in CASES
        if backend != "flex" or case == "gqa-33x97"]


@pytest.mark.parametrize("masking", MASKINGS)
@pytest.mark.parametrize("dtype", list(TOLERANCES), ids=str)
@pytest.mark.parametrize(("backend", "case"), GRID, ids=[f"{b}-{c}" for b, c in GRID])
def test_backend_matches_float64_oracle_on_cuda(backend, dtype, case, masking, rng):
    q, k, v, kwargs = make_call(case, masking, torch.float64, rng)
    q, k, v = (x.to(dtype) for x in (q, k, v))  # the oracle sees the very values the GPU gets
    kwargs = {n: x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for n, x in kwargs.items()}
    expected_out, expected_weights, expected_lse = oracle(q, k, v, kwargs)
    q, k, v, kwargs = _to_cuda(q, k, v, kwargs)
    result = attnkit.attention(q, k, v, backend=backend, need_weights=True, **kwargs)
    assert result.output.device.type == CUDA and result.output.dtype == dtype
    _close(result.output, expected_out, dtype, "output")
    _close(result.weights, expected_weights, dtype, "weights")
    if result.lse is not None:
        lse = numpy(result.lse)
        assert (np.isneginf(lse) == np.isneginf(expected_lse)).all(), "lse -inf exactly on fully masked rows"


GRADIENT_CALLS = {
    "window": lambda L, H: {"window": 37},
    "bottom-right": lambda L, H: {"is_causal": True, "causal_align": "bottom-right"},
    "block-mask": lambda L, H: {"mask": masks.block_mask(masks.document_mod(torch.arange(L, device=CUDA) * 3 // L),
                                                           None, None, L, L, device=CUDA)},
    "score_mod": lambda L, H: {"is_causal": True, "score_mod": lambda s, b, h, qi, ki: 20 * torch.tanh(s / 20)},
    "sinks": lambda L, H: {"window": 50, "sinks": torch.linspace(-1, 2, H, device=CUDA, dtype=torch.float64)},
    "empty-rows": lambda L, H: {"mask": (torch.arange(L, device=CUDA) % 7 != 3)[:, None].expand(L, L).contiguous()},
}


@pytest.mark.parametrize("name", list(GRADIENT_CALLS))
def test_flex_gradients_equal_float64_autograd(name, rng):
    B, H, Hkv, L, E = 2, 4, 2, 300, 64
    kwargs = GRADIENT_CALLS[name](L, H)
    q64, k64, v64 = (randn(B, h, L, E, dtype=torch.float64, generator=rng).to(CUDA) for h in (H, Hkv, Hkv))
    grads = {}
    for label, dtype, backend in (("flex", torch.float32, "flex"), ("oracle", torch.float64, "reference")):
        q, k, v = (x.to(dtype).requires_grad_() for x in (q64, k64, v64))
        call = dict(kwargs)
        sinks = call.get("sinks")
        if sinks is not None:
            call["sinks"] = sinks.to(dtype).requires_grad_()
        out = attnkit.attention(q, k, v, backend=backend, **call).output
        out.backward(torch.ones_like(out))
        grads[label] = [x.grad.double() for x in (q, k, v)] + ([call["sinks"].grad.double()] if sinks is not None else [])
    for got, want in zip(grads["flex"], grads["oracle"]):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)


SYNC_FREE_CALLS = {
    "dense": lambda L: {},
    "causal": lambda L: {"is_causal": True},
    "padding": lambda L: {"mask": masks.padding(torch.tensor([L, L // 2], device=CUDA), L)},
    "window": lambda L: {"window": 256},
    "longformer": lambda L: {"mask": masks.pattern_block_mask("longformer", L, width=256, device=CUDA)},
    "score_mod": lambda L: {"is_causal": True, "score_mod": lambda s, b, h, qi, ki: 30 * torch.tanh(s / 30)},
    "sinks": lambda L: {"is_causal": True, "sinks": torch.zeros(8, device=CUDA)},
    # a score_mod reading a table on the GPU (auto probes it on the call's device)
    "score_mod_table": lambda L: {"is_causal": True,
                                  "score_mod": lambda s, b, h, qi, ki, t=torch.linspace(0, 1, 8, device=CUDA): s + t[h]},
}


@pytest.mark.parametrize("name", list(SYNC_FREE_CALLS))
def test_auto_is_fused_and_sync_free_forward_and_backward(name, monkeypatch):
    monkeypatch.setattr(tiled, "forward", lambda *a: pytest.fail("the tiled loop ran on CUDA"))
    L = 2048
    q, k, v = (torch.randn(2, 8, L, 64, device=CUDA, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    kwargs = SYNC_FREE_CALLS[name](L)
    attnkit.attention(q, k, v, **kwargs).output.sum().backward()  # compiles, caches: may sync
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = attnkit.attention(q, k, v, **kwargs).output
        out.sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize(("dtype", "masked"), [(torch.float32, False), (torch.float32, True), (torch.bfloat16, True),
                                             (torch.bfloat16, False)], ids=["fp32", "fp32-mask", "bf16-mask", "bf16"])
def test_grouped_sdpa_calls_reach_a_fused_kernel(dtype, masked, rng):
    """Grouped-query calls (16 query heads, 4 key heads) with a padding mask or in float32 are
    ones PyTorch's flash kernel cannot take; SDPA would run its math path (scores materialised,
    0.63 ms of host time per decoding call). The backend repeats the keys for them instead, and
    the result still equals the float64 oracle."""
    q = randn(2, 16, 5, 64, dtype=torch.float64, generator=rng)
    k, v = (randn(2, 4, 37, 64, dtype=torch.float64, generator=rng) for _ in range(2))
    mask = torch.ones(2, 1, 1, 37, dtype=torch.bool)
    mask[0, ..., :9] = False
    kwargs = {"mask": mask} if masked else {}
    expected = oracle(q, k, v, kwargs)[0]
    args = [x.to(CUDA, dtype) for x in (q, k, v)]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        out = attnkit.attention(*args, backend="sdpa", **{name: x.to(CUDA) for name, x in kwargs.items()}).output
    ran = {event.name for event in profile.events()}
    assert "aten::_scaled_dot_product_attention_math" not in ran, sorted(n for n in ran if "attention" in n)
    _close(out, expected, dtype, f"{dtype} masked={masked}")


def test_lengths_of_one_bucket_compile_once_on_cuda(rng):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    compiles = []
    for L in (1100, 1200, 1280, 2000):  # 1100-1280 share the 1280 bucket; 2000 is in 2048
        q, k, v = (torch.randn(1, 8, L, 64, device=CUDA, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        ids = torch.arange(L, device=CUDA) * 4 // L
        for kwargs in ({"window": 128}, {"mask": masks.block_mask(masks.document_mod(ids), None, None, L, L, device=CUDA)}):
            before = counters["stats"]["unique_graphs"]
            attnkit.attention(q, k, v, backend="flex", **kwargs).output.sum().backward()
            compiles.append(counters["stats"]["unique_graphs"] - before)
    assert compiles[2:6] == [0, 0, 0, 0], compiles


def test_million_token_block_masks_on_the_gpu_are_fast_and_small():
    n = 1 << 20
    flags = torch.zeros(n, dtype=torch.bool, device=CUDA)
    flags[:16] = True
    builders = {
        "longformer": lambda: longformer_block_mask(512, flags),
        "documents": lambda: document_block_mask(document_ids(torch.full((64,), n // 64, device=CUDA))),
    }
    for name, build in builders.items():
        build()  # warm up the kernels
        timed = {}

        def run(build=build):
            start = time.perf_counter()
            timed["built"] = build()
            torch.cuda.synchronize()
            timed["seconds"] = time.perf_counter() - start

        peak_mb = peak_extra_mb(run, CUDA)
        assert timed["built"].kinds.device.type == CUDA
        assert timed["seconds"] < 1.0 and peak_mb < 256, (name, timed["seconds"], peak_mb)


@pytest.mark.parametrize("masked", [False, True], ids=["plain", "padding"])
def test_latent_decoding_folds_query_heads_instead_of_repeating_the_latent(masked, rng):
    """MLA's absorbed decoding step: 16 query heads over one 576-wide latent key head (values its first 512).
    Flash takes no head of 576, so the backend folds the query heads into rows of the one key head rather than
    repeating the latent 16 times: equal to the float64 oracle, and the call's extra memory far below one
    repeated copy of the keys."""
    S = 4096
    q = randn(2, 16, 1, 576, dtype=torch.float64, generator=rng)
    k = randn(2, 1, S, 576, dtype=torch.float64, generator=rng)
    v = k[..., :512]
    kwargs = {"is_causal": True, "causal_align": "bottom-right", "scale": 192**-0.5}
    if masked:
        mask = torch.ones(2, 1, 1, S, dtype=torch.bool)
        mask[1, ..., :1000] = False
        kwargs["mask"] = mask
    expected = oracle(q, k, v, kwargs)[0]
    args = [x.to(CUDA, torch.bfloat16) for x in (q, k)]
    args.append(args[1][..., :512])
    moved = {name: x.to(CUDA) if isinstance(x, torch.Tensor) else x for name, x in kwargs.items()}
    out = attnkit.attention(*args, **moved).output
    _close(out, expected, torch.bfloat16, f"masked={masked}")
    repeated_mb = 2 * 16 * S * (576 + 512) * 2 / 2**20
    peak = peak_extra_mb(lambda: attnkit.attention(*args, **moved), CUDA)
    assert peak < repeated_mb / 8, (peak, repeated_mb)


def test_index_tensors_built_during_graph_capture_are_not_kept():
    """Kernels captured into a CUDA graph do not run until it is replayed: index tensors built then are the
    call's own (built afresh), never kept for later calls; outside capture, the kept ones hold their values."""
    from attnkit.functional.block_mask import _kept_grids, index_grids

    device = torch.device("cuda")
    _kept_grids.cache_clear()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        index_grids(1, 2, 3, 8, 0, 5, device)
    torch.cuda.current_stream().wait_stream(stream)
    assert _kept_grids.cache_info().currsize == 0
    b, h, q_idx, kv_idx = index_grids(1, 2, 3, 8, 0, 5, device)
    assert _kept_grids.cache_info().currsize == 1
    assert torch.equal(q_idx.view(-1).cpu(), torch.arange(3, 8, dtype=torch.int32))
    assert torch.equal(kv_idx.view(-1).cpu(), torch.arange(5, dtype=torch.int32))
    assert torch.equal(h.view(-1).cpu(), torch.arange(2, dtype=torch.int32)) and b.item() == 0
