"""Attention speed and memory: every attnkit backend against PyTorch SDPA, flex_attention and the
naive three-line implementation, over sequence length, masks, forward / forward+backward, dtypes.

One *point* is (mask, n, dtype, mode). For each point one fresh process times every
implementation round-robin (:func:`attnkit.bench.harness.time_round_robin`), and one fresh
process per implementation measures its peak extra memory. Ratios are to ``torch-sdpa`` from the
same rounds. Implementations predicted to need more than ``max_call_seconds`` per call
(extrapolated from the previous size) or more than ``max_memory_gb`` are skipped, with the reason
recorded.

Implementations:
    torch-sdpa  ``F.scaled_dot_product_attention`` called directly: the baseline. A sliding
                window or padding is given to it as the equivalent boolean mask, built before timing.
    naive       the three lines from tutorials: ``softmax(q k^T / sqrt(E), masked) v``.
    torch-flex  ``torch.compile(flex_attention)`` with a block mask built by torch's
                ``create_block_mask`` before timing (compile time excluded from the timings,
                reported as ``compile_s``).
    reference / sdpa / tiled / flex / auto   ``attnkit.attention(backend=...)``; flex and auto
                (which compiles flex on CUDA) make one untimed first call, reported as ``compile_s``.

Masks: ``dense``; ``causal``; ``window`` (causal sliding window); ``padding`` (the last quarter of
the keys are padding, as in a batch whose longest example sets the length). Sparse patterns (not
in the default sweep): ``band`` (a two-sided band |i - j| <= window / 2 handed to attnkit as a
plain boolean tensor, to test ``auto``'s routing) and ``longformer``, ``bigbird``, ``documents``,
``sinks`` (attnkit.masks.PATTERNS defaults, handed to attnkit as a BlockMask built before timing,
its build time reported as ``mask_build_s``). torch-sdpa and naive get the equivalent boolean
tensor; flex gets the very same mask_mod.
"""

from __future__ import annotations

import argparse
import functools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from .._progress import progress_bar
from .harness import machine_info, peak_extra_mb, run_worker, serve_worker, time_round_robin

__all__ = ["IMPLEMENTATIONS", "MASKS", "DEFAULT_MASKS", "MODES", "DTYPES", "AttentionBench", "run", "naive_attention"]

IMPLEMENTATIONS = ("torch-sdpa", "naive", "torch-flex", "reference", "sdpa", "tiled", "flex", "auto")
COMPILING = ("torch-flex", "flex", "auto")
"""Implementations whose first call may compile (auto on CUDA only): called once before the timings."""


def _compiles(impl: str, device: str) -> bool:
    return impl in COMPILING and (impl != "auto" or device.startswith("cuda"))
DEFAULT_MASKS = ("dense", "causal", "window", "padding")
PATTERN_MASKS = ("longformer", "bigbird", "documents", "sinks")
MASKS = (*DEFAULT_MASKS, "band", *PATTERN_MASKS)
MODES = ("fwd", "fwd+bwd")
DTYPES = ("float32", "bfloat16", "float16")
BASELINE = "torch-sdpa"


@dataclass(frozen=True)
class AttentionBench:
    """What to measure. Shapes are (batch, heads, n, head_dim) for q, k and v (L = S = n)."""

    sizes: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
    masks: tuple[str, ...] = DEFAULT_MASKS
    modes: tuple[str, ...] = ("fwd",)
    dtypes: tuple[str, ...] = ("float32",)
    impls: tuple[str, ...] = IMPLEMENTATIONS
    batch: int = 1
    heads: int = 8
    head_dim: int = 64
    window: int = 256
    device: str = "cpu"
    repeats: int = 3
    min_seconds: float = 1.0
    max_call_seconds: float = 10.0
    max_memory_gb: float = 8.0
    memory: bool = True

    def __post_init__(self) -> None:
        for name, allowed in (("masks", MASKS), ("modes", MODES), ("dtypes", DTYPES), ("impls", IMPLEMENTATIONS)):
            values = getattr(self, name)
            bad = [x for x in values if x not in allowed]
            if bad or not values:
                raise ValueError(f"{name} must be a non-empty subset of {allowed}, got {list(values)}")
        if not self.sizes or any(not isinstance(n, int) or n < 1 for n in self.sizes):
            raise ValueError(f"sizes must be positive ints, got {list(self.sizes)}")
        for name in ("batch", "heads", "head_dim", "window", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.device != "cpu" and not (self.device.startswith("cuda") and torch.cuda.is_available()):
            raise ValueError(f"device must be 'cpu' or an available CUDA device, got {self.device!r}")
        if self.max_call_seconds <= 0 or self.max_memory_gb <= 0:
            raise ValueError("max_call_seconds and max_memory_gb must be > 0")

    def points(self) -> Iterator[tuple[str, str, str, int]]:
        for mode in self.modes:
            for dtype in self.dtypes:
                for mask in self.masks:
                    for n in sorted(self.sizes):
                        yield mode, dtype, mask, n


def naive_attention(q, k, v, mask=None):
    """The three-line attention of tutorials: every score, a masked softmax, a weighted sum."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    scores = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


# ---------------------------------------------------------------------------------------------
# One point inside a worker process


@functools.lru_cache(maxsize=4)
def _sparse(kind: str, n: int, window: int, device):
    """(mask_mod, BlockMask or None, seconds to build it) of a sparse mask kind."""
    from .. import masks

    mod = masks.window_mod(window) if kind == "band" else masks.PATTERNS[kind](n)
    if kind == "band":
        return mod, None, 0.0
    start = time.perf_counter()
    blocks = masks.pattern_block_mask(kind, n, device=device)  # closed form where the pattern has one
    return mod, blocks, time.perf_counter() - start


def _boolean_mask(kind: str, n: int, window: int, batch: int, device) -> torch.Tensor | None:
    from .. import masks

    if kind in ("band", *PATTERN_MASKS):
        mod, blocks, _ = _sparse(kind, n, window, device)
        if blocks is not None:
            return blocks.to_dense()[0, 0]
        index = torch.arange(n, device=device)
        return mod(None, None, index[:, None], index[None, :])
    if kind == "causal":
        return masks.causal(n, n, device=device)
    if kind == "window":
        return masks.sliding_window(n, n, window, device=device)
    if kind == "padding":
        return masks.padding(torch.full((batch,), _padded_length(n), device=device), n)
    return None


def _padded_length(n: int) -> int:
    return max(1, (3 * n) // 4)


def _flex(kind: str, n: int, window: int, batch: int, device):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    length = _padded_length(n)
    mods = {
        "causal": lambda b, h, i, j: i >= j,
        "window": lambda b, h, i, j: (i >= j) & (i - j < window),
        "padding": lambda b, h, i, j: j < length,
    }
    block_mask = None
    if kind in ("band", *PATTERN_MASKS):
        block_mask = create_block_mask(_sparse(kind, n, window, device)[0], None, None, n, n, device=device)
    elif kind in mods:
        block_mask = create_block_mask(mods[kind], None, None, n, n, device=device)
    compiled = torch.compile(flex_attention, dynamic=False)
    return lambda q, k, v: compiled(q, k, v, block_mask=block_mask)


def _attnkit_output(q, k, v, backend: str, kwargs: dict[str, Any]) -> torch.Tensor:
    import attnkit

    return attnkit.attention(q, k, v, backend=backend, **kwargs).output


def _forward_calls(spec: dict, q, k, v) -> dict[str, Callable[[], torch.Tensor]]:
    kind, n, window, batch = spec["mask"], spec["n"], spec["window"], spec["batch"]
    need_bool = {"torch-sdpa", "naive"} & set(spec["impls"])
    bool_mask = _boolean_mask(kind, n, window, batch, q.device) if need_bool else None
    # attnkit takes the structure as arguments (nothing materialised); padding as a (B, 1, 1, S) mask.
    kwargs: dict[str, Any]
    if kind == "band":
        kwargs = {"mask": bool_mask if bool_mask is not None else _boolean_mask(kind, n, window, batch, q.device)}
    elif kind in PATTERN_MASKS:
        kwargs = {"mask": _sparse(kind, n, window, q.device)[1]}
    else:
        kwargs = {
            "dense": {},
            "causal": {"is_causal": True},
            "window": {"window": window},
            "padding": {"mask": _boolean_mask("padding", n, window, batch, q.device)},
        }[kind]
    calls: dict[str, Callable[[], torch.Tensor]] = {}
    for impl in spec["impls"]:
        if impl == "torch-sdpa":
            sdpa_mask = None if kind == "causal" else bool_mask
            calls[impl] = functools.partial(F.scaled_dot_product_attention, q, k, v, attn_mask=sdpa_mask, is_causal=kind == "causal")
        elif impl == "naive":
            calls[impl] = lambda: naive_attention(q, k, v, bool_mask)
        elif impl == "torch-flex":
            flex = _flex(kind, n, window, batch, q.device)
            calls[impl] = functools.partial(flex, q, k, v)
        else:
            calls[impl] = functools.partial(_attnkit_output, q, k, v, impl, kwargs)
    return calls


def _inputs(spec: dict, n: int):
    torch.manual_seed(0)
    dtype = getattr(torch, spec["dtype"])
    grad = spec["mode"] == "fwd+bwd"
    shape = (spec["batch"], spec["heads"], n, spec["head_dim"])
    return [torch.randn(shape, dtype=dtype, device=spec["device"], requires_grad=grad) for _ in range(3)]


def _calls(spec: dict, n: int | None = None) -> dict[str, Callable[[], object]]:
    """The timed callables of one point: forward under no_grad, or forward + backward."""
    n = spec["n"] if n is None else n
    q, k, v = _inputs(spec, n)
    forward = _forward_calls(dict(spec, n=n), q, k, v)
    if spec["mode"] == "fwd":
        def no_grad(f):
            def run():
                with torch.no_grad():
                    return f()
            return run
        return {name: no_grad(f) for name, f in forward.items()}
    d_out = torch.randn_like(q)

    def with_backward(f):
        def run():
            for x in (q, k, v):
                x.grad = None
            f().backward(d_out)
        return run

    return {name: with_backward(f) for name, f in forward.items()}


def _sync(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


def time_worker(spec: dict) -> dict:
    calls = _calls(spec)
    compile_s = {}
    for name in calls:  # compile outside the timings
        if _compiles(name, spec["device"]):
            start = time.perf_counter()
            calls[name]()
            _sync(spec["device"])()
            compile_s[name] = time.perf_counter() - start
    result = time_round_robin(
        calls, repeats=spec["repeats"], min_seconds=spec["min_seconds"], sync=_sync(spec["device"])
    )
    for name, seconds in compile_s.items():
        result[name]["compile_s"] = seconds
    if spec["mask"] in PATTERN_MASKS:
        build_s = _sparse(spec["mask"], spec["n"], spec["window"], spec["device"])[2]
        for name in ("reference", "sdpa", "tiled", "flex", "auto"):
            if name in result:
                result[name]["mask_build_s"] = build_s
    return result


def memory_worker(spec: dict) -> dict:
    (impl,) = spec["impls"]
    if not _compiles(impl, spec["device"]):  # initialise MKL, OpenMP, autograd on a small problem first
        _calls(spec, n=min(spec["n"], 256))[impl]()
    run = _calls(spec)[impl]
    if _compiles(impl, spec["device"]):
        run()  # compiles for this shape
    return {"peak_extra_mb": peak_extra_mb(run, spec["device"])}


# ---------------------------------------------------------------------------------------------
# The sweep


@dataclass
class _History:
    """Times seen so far per (mode, dtype, mask, impl), for predicting the next size."""

    seen: dict = field(default_factory=dict)

    def add(self, key, n: int, seconds: float) -> None:
        self.seen.setdefault(key, []).append((n, seconds))

    def predict(self, key, n: int) -> float | None:
        points = self.seen.get(key, [])
        if not points:
            return None
        (n1, t1) = points[-1]
        exponent = 2.0
        if len(points) >= 2:  # the measured growth, between linear and quadratic
            (n0, t0) = points[-2]
            if n1 > n0 and t0 > 0 and t1 > 0:
                exponent = min(2.0, max(1.0, math.log(t1 / t0) / math.log(n1 / n0)))
        return t1 * (n / n1) ** exponent


def _quadratic_bytes(impl: str, mask: str, mode: str, config: AttentionBench, n: int) -> float:
    """Memory an implementation that materialises (n, n) tensors needs, roughly; 0 otherwise."""
    per_matrix = config.batch * config.heads * n * n * 4
    if impl in ("naive", "reference"):
        return per_matrix * (3 if mode == "fwd" else 5)
    if impl in ("torch-sdpa", "sdpa") and mask in ("window", "band", *PATTERN_MASKS):
        return n * n * 5  # the boolean (n, n) mask and SDPA's float copy of it
    return 0.0


def _skip_reason(impl, mode, dtype, mask, n, config: AttentionBench, history: _History) -> str | None:
    if impl in ("torch-flex", "flex") and mode == "fwd+bwd" and config.device == "cpu":
        return "FlexAttention does not support backward on CPU (NotImplementedError in torch)"
    need = _quadratic_bytes(impl, mask, mode, config, n)
    if need > config.max_memory_gb * 2**30:
        return f"would need ~{need / 2**30:.0f} GiB > max_memory_gb={config.max_memory_gb:g}"
    predicted = history.predict((mode, dtype, mask, impl), n)
    if predicted is not None and predicted > config.max_call_seconds:
        return f"predicted {predicted:.0f} s per call > max_call_seconds={config.max_call_seconds:g}"
    return None


def run(
    config: AttentionBench,
    *,
    on_point: Callable[[dict], None] | None = None,
    progress: bool = False,
) -> dict:
    """Measure every point of ``config``; returns the report (config, machine, results rows).

    ``on_point(report_so_far)`` is called after each point (the CLI writes the JSON there, so
    that an interrupted run keeps every finished point). ``progress`` shows a tqdm bar of the points.
    """
    history = _History()
    rows: list[dict] = []
    report = {"benchmark": "attention", "config": asdict(config), "machine": machine_info(config.device), "results": rows}
    points = list(config.points())
    for mode, dtype, mask, n in progress_bar(points, progress=progress, desc="attnkit bench", unit="point", leave=True):
        base = {"mode": mode, "dtype": dtype, "mask": mask, "n": n}
        spec = {
            **base,
            "batch": config.batch, "heads": config.heads, "head_dim": config.head_dim,
            "window": config.window, "device": config.device, "repeats": config.repeats,
            "min_seconds": config.min_seconds,
        }
        reasons = {impl: _skip_reason(impl, mode, dtype, mask, n, config, history) for impl in config.impls}
        timed_impls = [impl for impl in config.impls if reasons[impl] is None]
        timed = {}
        timeout = max(120.0, 20 * config.max_call_seconds * max(1, len(timed_impls)))
        if timed_impls:
            timed = run_worker(__name__, {**spec, "task": "time", "impls": timed_impls}, timeout=timeout)
            compiling = [impl for impl in timed_impls if impl in ("torch-flex", "flex")]
            if "error" in timed and compiling:  # a compile failing must not sink the rest
                rest = [impl for impl in timed_impls if impl not in compiling]
                timed = run_worker(__name__, {**spec, "task": "time", "impls": rest}, timeout=timeout) if rest else {}
                for impl in compiling:
                    alone = run_worker(__name__, {**spec, "task": "time", "impls": [impl]}, timeout=timeout)
                    timed[impl] = alone if "error" in alone else alone[impl]
        for impl in config.impls:
            row = dict(base, impl=impl)
            if reasons[impl] is not None:
                row["skipped"] = reasons[impl]
            elif "error" in timed:
                row["skipped"] = f"failed: {timed['error']}"
            elif "error" in timed.get(impl, {}):
                row["skipped"] = f"failed: {timed[impl]['error']}"
            else:
                row.update(timed[impl])
                history.add((mode, dtype, mask, impl), n, row["time_s"])
                if config.memory:
                    memory = run_worker(__name__, {**spec, "task": "memory", "impls": [impl]}, timeout=timeout)
                    row["peak_extra_mb"] = memory.get("peak_extra_mb")
                    if "error" in memory:
                        row["memory_error"] = memory["error"]
            rows.append(row)
        if on_point is not None:
            on_point(report)
    return report


def ratios(rows: Sequence[dict]) -> list[dict]:
    """Each timed row with ``x_sdpa`` = baseline time / its time (throughput ratio) for its point."""
    base = {
        (r["mode"], r["dtype"], r["mask"], r["n"]): r["time_s"]
        for r in rows
        if r["impl"] == BASELINE and "time_s" in r
    }
    out = []
    for r in rows:
        r = dict(r)
        b = base.get((r["mode"], r["dtype"], r["mask"], r["n"]))
        if b is not None and "time_s" in r:
            r["x_sdpa"] = b / r["time_s"]
        out.append(r)
    return out


def _worker_main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="worker process of attnkit.bench.attention")
    parser.add_argument("--worker", required=True)
    return serve_worker(parser.parse_args(argv).worker, _work)


def _work(spec: dict) -> dict:
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    return time_worker(spec) if spec["task"] == "time" else memory_worker(spec)


if __name__ == "__main__":
    raise SystemExit(_worker_main())
