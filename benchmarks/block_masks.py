"""Building block masks on the CPU: the closed-form builders at up to a million tokens against
evaluating the mask_mod on every pair (``attnkit.masks.block_mask``), each in a fresh process.

For every pattern and length: seconds and peak extra resident memory (MB) of the closed-form
build; at the ``--dense-sizes`` also the dense evaluation's, and whether the two tables are equal.
Writes benchmarks/results/block_masks.json (atomically) and prints a markdown table.

    python benchmarks/block_masks.py                        # 64K, 256K, 1M; dense at 64K
    python benchmarks/block_masks.py --sizes 65536 --dense-sizes
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from attnkit import masks
from attnkit._files import write_json
from attnkit.bench.harness import machine_info, peak_extra_mb, run_worker, serve_worker

PATTERNS = {  # attnkit.masks.PATTERNS with the Longformer (512 two-sided + 16 globals)
    "longformer": {"window": 512, "num_global": 16},
    "documents": {"documents": 64},
    "causal": {},
    "sinks": {"sinks": 4, "window": 4096},
    "prefix-lm": {},
}


def _worker(spec: dict) -> dict:
    torch.set_num_threads(spec["threads"])
    name, n = spec["pattern"], spec["n"]
    options = PATTERNS[name]
    masks.pattern_block_mask(name, 4096, **options)  # warm up the kernels
    result = {}
    timing = {}

    def closed():
        start = time.perf_counter()
        timing["built"] = masks.pattern_block_mask(name, n, **options)
        timing["seconds"] = time.perf_counter() - start

    result["closed_peak_mb"] = peak_extra_mb(closed)
    result["closed_s"] = timing["seconds"]
    built = timing.pop("built")
    result["tiles"] = built.kinds.numel()
    result["occupancy"] = built.occupancy()
    if spec["dense"]:
        def dense():
            start = time.perf_counter()
            timing["built"] = masks.block_mask(masks.PATTERNS[name](n, n, **options), None, None, n, n)
            timing["seconds"] = time.perf_counter() - start

        result["dense_peak_mb"] = peak_extra_mb(dense)
        result["dense_s"] = timing["seconds"]
        result["equal_tiles"] = bool(torch.equal(timing["built"].kinds, built.kinds))
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[65536, 262144, 1 << 20])
    parser.add_argument("--dense-sizes", type=int, nargs="*", default=[65536])
    parser.add_argument("--patterns", nargs="+", choices=list(PATTERNS), default=list(PATTERNS))
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "block_masks.json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return serve_worker(args.worker, _worker)
    rows = []
    points = [(name, n) for name in args.patterns for n in args.sizes]
    for name, n in tqdm(points, desc="block masks", unit="mask"):
        spec = {"pattern": name, "n": n, "dense": n in args.dense_sizes, "threads": args.threads}
        rows.append({"pattern": name, "n": n, **run_worker(__file__, spec, timeout=3600)})
        report = {"benchmark": "block_masks", "machine": machine_info("cpu"), "threads": args.threads, "rows": rows}
        write_json(args.out, report)  # every finished row is kept
    print("| pattern | n | closed form s | closed form peak MB | dense s | dense peak MB | same tiles |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['pattern']} | {r['n']} | {r['error']} |")
            continue
        dense = (f"{r['dense_s']:.1f} | {r['dense_peak_mb']:.0f} | {r['equal_tiles']}" if "dense_s" in r else "- | - | -")
        print(f"| {r['pattern']} | {r['n']} | {r['closed_s']:.3f} | {r['closed_peak_mb']:.0f} | {dense} |")
    print(f"\nwritten {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
