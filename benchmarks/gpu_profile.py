"""Where the time goes in the cells of the GPU record that miss their target: a ``torch.profiler`` trace of
attnkit's call and of the baseline's, for the worst cells of ``benchmarks/gpu.py``'s JSON files.

Targets: dense and causal ``auto`` >= 0.97x SDPA; window and Longformer >= 0.95x compiled flex.
For each of at most ``--cases`` missed cells (the lowest ratios first, one per pattern), the same inputs are
built as gpu.py builds them, both calls warmed up (compiles included), then ``--calls`` calls of each
profiled (CPU and CUDA activity). Writes, under ``--out``: ``profile.txt`` (for each case, both sides' op
tables sorted by device time and by host time, and the totals) and one gzipped Chrome trace per side
(``<case>_<side>.json.gz``, open in Perfetto or chrome://tracing).

    python benchmarks/gpu_profile.py results/gpu/core_4k.json results/gpu/core_long.json --out /tmp/profiles
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import gpu  # noqa: E402  (benchmarks/gpu.py: the same cases, built the same way)

import attnkit  # noqa: E402

TARGETS = {"dense": 0.97, "causal": 0.97, "window": 0.95, "longformer": 0.95}


def pattern_key(name: str) -> str:
    return "window" if name.startswith("causal window") else "longformer" if name.startswith("Longformer") else name


def missed(reports: list[dict], limit: int) -> list[dict]:
    """The missed cells, the lowest ratio first, one per pattern, at most ``limit``."""
    cells = []
    for report in reports:
        shape = report["shape"]
        for row in report["attention"]:
            key = pattern_key(row["pattern"])
            for mode in ("fwd", "fwd+bwd"):
                ratio = row.get(f"ratio_{mode}")
                if ratio is not None and ratio < TARGETS[key]:
                    cells.append({"n": row["n"], "pattern": row["pattern"], "key": key, "mode": mode, "ratio": ratio,
                                  "shape": (shape["B"], shape["H"], shape["E"])})
    cells.sort(key=lambda c: c["ratio"])
    chosen, seen = [], set()
    for cell in cells:
        if cell["key"] not in seen:
            chosen.append(cell)
            seen.add(cell["key"])
    return chosen[:limit]


def profile_cell(cell: dict, calls: int, out: Path) -> str:
    batch, heads, head_dim = cell["shape"]
    n = cell["n"]
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    d_out = torch.randn_like(q)
    name, theirs, kwargs = next(c for c in gpu._cases(n, (cell["key"],)) if c[0] == cell["pattern"])
    sides = {"torch": theirs, "attnkit": lambda q, k, v: attnkit.attention(q, k, v, **kwargs).output}
    label = f"{cell['key']}_{n}_{cell['mode'].replace('+', '_')}"
    text = [f"## {cell['pattern']}, n {n}, B {batch}, H {heads}, E {head_dim}, {cell['mode']}: "
            f"ratio {cell['ratio']:.3f} (target {TARGETS[cell['key']]})"]
    for side, call in sides.items():
        def run(call=call):
            if cell["mode"] == "fwd":
                with torch.no_grad():
                    call(q, k, v)
            else:
                call(q, k, v).backward(d_out)

        for _ in range(3):
            run()  # warm-up, compiles included
        torch.cuda.synchronize()
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(calls):
                run()
            torch.cuda.synchronize()
        averages = prof.key_averages()
        text.append(f"\n### {side}: {calls} calls, by device time\n")
        text.append(averages.table(sort_by="cuda_time_total", row_limit=20))
        text.append(f"\n### {side}: by host time\n")
        text.append(averages.table(sort_by="self_cpu_time_total", row_limit=15))
        trace = out / f"{label}_{side}.json"
        prof.export_chrome_trace(str(trace))
        with open(trace, "rb") as raw, gzip.open(f"{trace}.gz", "wb") as packed:
            shutil.copyfileobj(raw, packed)
        trace.unlink()
    return "\n".join(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", type=Path, nargs="+", help="benchmarks/gpu.py JSON files")
    parser.add_argument("--cases", type=int, default=3)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    torch._dynamo.config.recompile_limit = 512
    reports = [json.loads(path.read_text()) for path in args.reports if path.is_file()]
    cells = missed(reports, args.cases)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = args.out / "profile.txt"
    sections = [f"# Missed cells profiled: {len(cells)}"]
    for cell in cells:
        print(f"profiling {cell['pattern']} n={cell['n']} {cell['mode']} (ratio {cell['ratio']:.3f})", flush=True)
        sections.append(profile_cell(cell, args.calls, args.out))
        summary.write_text("\n\n".join(sections))  # what is finished stays if the step is cut short
    summary.write_text("\n\n".join(sections))
    print(f"wrote {summary}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
