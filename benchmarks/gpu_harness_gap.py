"""Why two harnesses time the same CUDA call apart (issue 62): the 4K, B 8, bf16 causal call took 2.33-2.37 ms in
``benchmarks/gpu.py`` and 2.15 ms in ``benchmarks/gpu_nan_rule.py`` (benchmarks/results/gpu/2026-11-27/).

The harnesses differ in two ways, crossed here in one process, every cell interleaved round by round:

- the inputs: ``requires_grad=True`` under ``no_grad`` (gpu.py) or plain tensors (gpu_nan_rule.py);
- the timer: the median of single calls between CUDA events with a wait after each (gpu.py's ``ms``), or calls
  issued back to back between two events (both harnesses' ``back_to_back``).

Each cell is timed for SDPA, ``attnkit.attention`` and ``attnkit.attention`` with the NaN rule off. Then one
``torch.profiler`` trace per input kind lists the kernels of three attnkit calls (the device time of each kernel).

    PYTHONPATH=src python3 benchmarks/gpu_harness_gap.py --out $OUT/harness_gap.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import attnkit
from attnkit._files import write_json
from attnkit.bench.harness import cuda_back_to_back_ms, cuda_median_ms, finish_gpu_report, gpu_report

SIDES = {
    "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "attnkit": lambda q, k, v: attnkit.attention(q, k, v, is_causal=True).output,
}


def _rule_off(q, k, v):
    with attnkit.nan_rule(False):
        return attnkit.attention(q, k, v, is_causal=True).output


SIDES["attnkit, rule off"] = _rule_off
TIMERS = {"single": cuda_median_ms, "back_to_back": cuda_back_to_back_ms}


def _kernels(call, q, k, v) -> list[dict]:
    """The kernels of three calls: name, count, device microseconds in all."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            call(q, k, v)
        torch.cuda.synchronize()
    timed = [e for e in prof.key_averages() if e.device_time_total > 0]
    kernels = [e for e in timed if e.device_type.name == "CUDA"] or timed  # kernels, else the ops that ran them
    rows = [{"name": e.key, "count": e.count, "device_us": e.device_time_total} for e in kernels]
    return sorted(rows, key=lambda r: -r["device_us"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=10, help="calls per measure (gpu.py's --repeats)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu" / "harness_gap.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/gpu_harness_gap.py needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    shape = (args.batch, 32, args.n, 128)
    plain = [torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    inputs = {"plain": plain, "requires_grad": [x.clone().requires_grad_() for x in plain]}
    cells = {(kind, timer, side): [] for kind in inputs for timer in TIMERS for side in SIDES}
    with torch.no_grad():
        for _ in range(args.rounds):
            for kind, timer, side in cells:
                q, k, v = inputs[kind]
                run = lambda side=side, q=q, k=k, v=v: SIDES[side](q, k, v)  # noqa: E731
                cells[kind, timer, side].append(TIMERS[timer](run, args.repeats))
    rows = [{"inputs": kind, "timer": timer, "side": side, "ms": statistics.median(ms), "raw_ms": ms}
            for (kind, timer, side), ms in cells.items()]
    kernels = {kind: _kernels(SIDES["attnkit"], *inputs[kind]) for kind in inputs}
    report = gpu_report(n=args.n, batch=args.batch, heads=32, head_dim=128, repeats=args.repeats, rounds=args.rounds,
                        rows=rows, attnkit_kernels_of_three_calls=kernels)
    sdpa = {(r["inputs"], r["timer"]): r["ms"] for r in rows if r["side"] == "sdpa"}
    lines = ["| inputs | timer | side | ms | SDPA / this |", "|---|---|---|---|---|"]
    lines += [f"| {r['inputs']} | {r['timer']} | {r['side']} | {r['ms']:.3f} | {sdpa[r['inputs'], r['timer']] / r['ms']:.2f}x |"
              for r in rows]
    for kind, found in kernels.items():
        lines += ["", f"attnkit's kernels, three calls, {kind} inputs:"]
        lines += [f"  {r['count']:4d} x {r['device_us'] / r['count']:9.1f} us  {r['name'][:90]}" for r in found[:8]]
    write_json(args.out, report)
    finish_gpu_report(args.out, report, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
