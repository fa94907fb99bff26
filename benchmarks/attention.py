"""Time and peak memory of attnkit's attention backends against PyTorch SDPA, same run.

Each point (mask, n, implementation) runs in a fresh process: inputs are allocated, the peak
resident set is reset (/proc/self/clear_refs), the call is timed (median of --repeats after one
warm-up) and the peak extra memory is the high-water mark minus the resident set before the call.

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
MIN_SECONDS = 1.0  # keep repeating short calls until this much time is measured
WARMUP_SECONDS = 0.5


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def worker(impl: str, mask_kind: str, n: int, window: int, repeats: int, heads: int, head_dim: int) -> dict:
    import torch
    import torch.nn.functional as F

    import attnkit
    from attnkit import masks

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, head_dim) for _ in range(3))
    if impl == "torch-sdpa":
        bool_mask = masks.sliding_window(n, n, window) if mask_kind == "window" else None

        def run():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask, is_causal=mask_kind == "causal")
    else:
        kwargs = {"dense": {}, "causal": {"is_causal": True}, "window": {"window": window}}[mask_kind]

        def run():
            return attnkit.attention(q, k, v, backend=impl, **kwargs).output

    with torch.no_grad():
        warm_until = time.perf_counter() + WARMUP_SECONDS
        run()  # warm-up: thread pools, allocator, caches of a fresh process
        while time.perf_counter() < warm_until:
            run()
        baseline_mb = _status_mb("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak resident set (VmHWM)
        times = []
        while len(times) < repeats or (sum(times) < MIN_SECONDS and len(times) < 200):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        peak_mb = _status_mb("VmHWM")
    return {
        "time_s": statistics.median(times),
        "repeats": len(times),
        "peak_extra_mb": max(0.0, peak_mb - baseline_mb),
    }


def run_point(impl: str, mask_kind: str, n: int, args) -> dict:
    if impl == "reference" and 3 * 4 * args.heads * n * n > REFERENCE_MAX_BYTES:
        return {"skipped": "reference would need > 6 GiB"}
    command = [
        sys.executable, __file__, "--worker", impl, mask_kind, str(n),
        "--window", str(args.window), "--repeats", str(args.repeats),
        "--heads", str(args.heads), "--head-dim", str(args.head_dim),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return {"skipped": f"failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


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
        lines.append(
            f"{r['mask']:<7} {r['n']:>6} {r['impl']:<10} {1000 * r['time_s']:>10.1f} {ratio:>7} {r['peak_extra_mb']:>9.0f}"
        )
    lines.append("x sdpa = torch-sdpa time / this time (throughput ratio, higher is faster)")
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
    parser.add_argument("--worker", nargs=3, metavar=("IMPL", "MASK", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        impl, mask_kind, n = args.worker
        print(json.dumps(worker(impl, mask_kind, int(n), args.window, args.repeats, args.heads, args.head_dim)))
        return 0

    from tqdm import tqdm

    points = [(m, n, i) for m in args.masks for n in args.sizes for i in args.impls]
    results = []
    for mask_kind, n, impl in tqdm(points, desc="attention benchmark", unit="point"):
        results.append({"mask": mask_kind, "n": n, "impl": impl, **run_point(impl, mask_kind, n, args)})
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
