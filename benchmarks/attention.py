"""Time and peak memory of attnkit's attention backends against PyTorch SDPA, same run.

Time: for each (mask, n) one process builds the inputs and times every implementation
round-robin (one call of each in turn, the order rotating every round, after a warm-up), so that
a slow spell of the machine or a position in the round hits
all of them alike; the table reports medians and the ratio to torch-sdpa from the same rounds.
Peak memory: each (mask, n, implementation) runs in a fresh process; the peak resident set is
reset (/proc/self/clear_refs) after a warm-up and the peak extra memory of one call is the
high-water mark minus the resident set before it.

Implementations:
    torch-sdpa  F.scaled_dot_product_attention called directly (the baseline; a sliding window is
                given to it as the equivalent boolean mask, built before timing)
    reference   attnkit backend="reference"
    sdpa        attnkit backend="sdpa"
    tiled       attnkit backend="tiled"
    auto        attnkit backend="auto"

Usage:
    python benchmarks/attention.py                      # n = 1K..16K, dense / causal / window 256
    python benchmarks/attention.py --sizes 1024 2048 --masks dense --repeats 2
Prints a table and writes JSON (default benchmarks/results/attention.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

IMPLEMENTATIONS = ("torch-sdpa", "reference", "sdpa", "tiled", "auto")
MASKS = ("dense", "causal", "window")
REFERENCE_MAX_BYTES = 6 << 30  # reference materialises ~3 (B, H, n, n) float32 tensors
MIN_SECONDS = 1.0  # keep repeating short calls until each implementation has this much time
WARMUP_SECONDS = 0.5


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def _callables(impls, mask_kind: str, n: int, window: int, heads: int, head_dim: int) -> dict:
    import torch
    import torch.nn.functional as F

    import attnkit
    from attnkit import masks

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, head_dim) for _ in range(3))
    bool_mask = masks.sliding_window(n, n, window) if mask_kind == "window" and "torch-sdpa" in impls else None
    kwargs = {"dense": {}, "causal": {"is_causal": True}, "window": {"window": window}}[mask_kind]

    def make(impl):
        if impl == "torch-sdpa":
            return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask, is_causal=mask_kind == "causal")
        return lambda: attnkit.attention(q, k, v, backend=impl, **kwargs).output

    return {impl: make(impl) for impl in impls}


def time_worker(impls, mask_kind: str, n: int, window: int, repeats: int, heads: int, head_dim: int) -> dict:
    """Median seconds per call of each implementation, timed round-robin in this process."""
    import torch

    calls = _callables(impls, mask_kind, n, window, heads, head_dim)
    times = {impl: [] for impl in calls}
    with torch.no_grad():
        warm_until = time.perf_counter() + WARMUP_SECONDS
        while True:
            for run in calls.values():
                run()
            if time.perf_counter() >= warm_until:
                break
        order = list(calls.items())
        while True:
            order = order[1:] + order[:1]  # rotate: no implementation always runs first
            for impl, run in order:
                start = time.perf_counter()
                run()
                times[impl].append(time.perf_counter() - start)
            done = [len(t) >= repeats and (sum(t) >= MIN_SECONDS or len(t) >= 200) for t in times.values()]
            if all(done):
                break
    return {impl: {"time_s": statistics.median(t), "repeats": len(t)} for impl, t in times.items()}


def memory_worker(impl: str, mask_kind: str, n: int, window: int, heads: int, head_dim: int) -> dict:
    """Peak extra resident memory (MB) of one call in this fresh process."""
    import torch

    run = _callables([impl], mask_kind, n, window, heads, head_dim)[impl]
    with torch.no_grad():
        run()  # warm-up
        baseline_mb = _status_mb("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak resident set (VmHWM)
        run()
        peak_mb = _status_mb("VmHWM")
    return {"peak_extra_mb": max(0.0, peak_mb - baseline_mb)}


def _subprocess(args, *worker_args) -> dict:
    command = [
        sys.executable, __file__, *worker_args,
        "--window", str(args.window), "--repeats", str(args.repeats),
        "--heads", str(args.heads), "--head-dim", str(args.head_dim),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fits(impl: str, n: int, heads: int) -> bool:
    return impl != "reference" or 3 * 4 * heads * n * n <= REFERENCE_MAX_BYTES


def run_size(mask_kind: str, n: int, args) -> list[dict]:
    impls = [impl for impl in args.impls if _fits(impl, n, args.heads)]
    timed = _subprocess(args, "--time-worker", mask_kind, str(n), ",".join(impls))
    rows = []
    for impl in args.impls:
        row = {"mask": mask_kind, "n": n, "impl": impl}
        if impl not in impls:
            row["skipped"] = "reference would need > 6 GiB"
        elif "error" in timed:
            row["skipped"] = f"failed: {timed['error']}"
        else:
            row.update(timed[impl])
            row.update(_subprocess(args, "--memory-worker", mask_kind, str(n), impl))
        rows.append(row)
    return rows


def machine() -> dict:
    import torch

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
    }


def format_table(results: list[dict]) -> str:
    lines = [
        f"{'mask':<7} {'n':>6} {'impl':<10} {'time ms':>10} {'x sdpa':>7} {'peak MB':>9}",
        "-" * 54,
    ]
    baseline = {(r["mask"], r["n"]): r.get("time_s") for r in results if r["impl"] == "torch-sdpa"}
    for r in results:
        if "skipped" in r:
            lines.append(f"{r['mask']:<7} {r['n']:>6} {r['impl']:<10} {r['skipped']}")
            continue
        base = baseline.get((r["mask"], r["n"]))
        ratio = f"{base / r['time_s']:.2f}" if base else "-"
        peak = f"{r['peak_extra_mb']:>9.0f}" if "peak_extra_mb" in r else f"{'?':>9}"
        lines.append(f"{r['mask']:<7} {r['n']:>6} {r['impl']:<10} {1000 * r['time_s']:>10.1f} {ratio:>7} {peak}")
    lines.append("x sdpa = torch-sdpa time / this time (throughput ratio, higher is faster)")
    return "\n".join(lines)


def format_markdown(results: list[dict]) -> str:
    """The results as a markdown table: one row per (mask, n), time and ratio per implementation."""
    impls = list(dict.fromkeys(r["impl"] for r in results))
    header = "| mask | n | " + " | ".join(f"{i} ms (x sdpa, MB)" for i in impls) + " |"
    lines = [header, "|" + "---|" * (2 + len(impls))]
    for key in dict.fromkeys((r["mask"], r["n"]) for r in results):
        rows = {r["impl"]: r for r in results if (r["mask"], r["n"]) == key}
        base = rows.get("torch-sdpa", {}).get("time_s")
        cells = []
        for impl in impls:
            r = rows.get(impl, {})
            if "time_s" not in r:
                cells.append("-")
                continue
            ratio = f"{base / r['time_s']:.2f}" if base else "-"
            cells.append(f"{1000 * r['time_s']:.1f} ({ratio}, {r.get('peak_extra_mb', float('nan')):.0f})")
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--masks", nargs="+", choices=MASKS, default=list(MASKS))
    parser.add_argument("--impls", nargs="+", choices=IMPLEMENTATIONS, default=list(IMPLEMENTATIONS))
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "attention.json")
    parser.add_argument("--render", type=Path, help="print a results JSON as a markdown table and exit")
    parser.add_argument("--time-worker", nargs=3, metavar=("MASK", "N", "IMPLS"), help=argparse.SUPPRESS)
    parser.add_argument("--memory-worker", nargs=3, metavar=("MASK", "N", "IMPL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.render:
        print(format_markdown(json.loads(args.render.read_text())["results"]))
        return 0
    shape = (args.window, args.heads, args.head_dim)
    if args.time_worker:
        mask_kind, n, impls = args.time_worker
        result = time_worker(impls.split(","), mask_kind, int(n), shape[0], args.repeats, *shape[1:])
        print(json.dumps(result))
        return 0
    if args.memory_worker:
        mask_kind, n, impl = args.memory_worker
        print(json.dumps(memory_worker(impl, mask_kind, int(n), *shape)))
        return 0

    from tqdm import tqdm

    results = []
    points = [(m, n) for m in args.masks for n in args.sizes]
    for mask_kind, n in tqdm(points, desc="attention benchmark", unit="size"):
        results.extend(run_size(mask_kind, n, args))
    table = format_table(results)
    print(table)
    report = {
        "benchmark": "attention",
        "shape": {"B": 1, "H": args.heads, "E": args.head_dim, "dtype": "float32", "window": args.window},
        "machine": machine(),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2))
    os.replace(tmp, args.out)  # atomic: a crash never leaves a half-written file
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
