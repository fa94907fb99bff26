"""Where the NaN rule's look goes on a large CUDA call (issue 62): the 4K, B 8, bf16 causal call is SDPA, then one look
at its output (a whole-tensor maximum and one wait). Here the look's parts and other ways of looking, in one process,
interleaved round by round, each timed as calls back to back between two CUDA events and as single calls:

- ``sdpa``: SDPA alone;
- ``+ amax``: SDPA and the output's maximum, no wait (the kernel's device time);
- ``+ amax, item``: SDPA, the maximum and a wait for it on the host (the look as shipped);
- ``+ sum, item``: the same with a float32 sum (NaN also where +inf meets -inf: a false alarm, never a miss);
- ``+ foreach max, item``: ``torch._foreach_max`` of the output (another reduction kernel);
- ``+ amax of E, item``: a maximum over E first, then over the rest;
- ``attnkit``: ``attnkit.attention`` as shipped.

    PYTHONPATH=src python3 benchmarks/gpu_look_cost.py --out $OUT/look_cost.json
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


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


WAYS = {
    "sdpa": _sdpa,
    "+ amax": lambda q, k, v: _sdpa(q, k, v).amax(),
    "+ amax, item": lambda q, k, v: _sdpa(q, k, v).amax().item(),
    "+ sum, item": lambda q, k, v: _sdpa(q, k, v).sum(dtype=torch.float32).item(),
    "+ foreach max, item": lambda q, k, v: torch._foreach_max([_sdpa(q, k, v)])[0].item(),
    "+ amax of E, item": lambda q, k, v: _sdpa(q, k, v).amax(-1).amax().item(),
    "attnkit": lambda q, k, v: attnkit.attention(q, k, v, is_causal=True).output,
}
TIMERS = {"back_to_back": cuda_back_to_back_ms, "single": cuda_median_ms}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu" / "look_cost.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/gpu_look_cost.py needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    q, k, v = (torch.randn(args.batch, 32, args.n, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cells = {(timer, way): [] for timer in TIMERS for way in WAYS}
    with torch.no_grad():
        for _ in range(args.rounds):
            for timer, way in cells:
                cells[timer, way].append(TIMERS[timer](lambda way=way: WAYS[way](q, k, v), args.repeats))
    rows = [{"timer": timer, "way": way, "ms": statistics.median(ms), "raw_ms": ms} for (timer, way), ms in cells.items()]
    report = gpu_report(n=args.n, batch=args.batch, heads=32, head_dim=128, repeats=args.repeats, rounds=args.rounds,
                        rows=rows)
    sdpa = {r["timer"]: r["ms"] for r in rows if r["way"] == "sdpa"}
    lines = ["| timer | way | ms | over SDPA us | SDPA / this |", "|---|---|---|---|---|"]
    lines += [f"| {r['timer']} | {r['way']} | {r['ms']:.3f} | {1000 * (r['ms'] - sdpa[r['timer']]):.0f} "
              f"| {sdpa[r['timer']] / r['ms']:.3f}x |" for r in rows]
    write_json(args.out, report)
    finish_gpu_report(args.out, report, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
