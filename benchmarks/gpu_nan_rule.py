"""What the NaN rule costs on CUDA, looking first or not, by size (issue 62): where ``nan.DEVICE_LOOK_MIN_BYTES`` lies.

For each call (bf16, E 128; plain dense and causal calls from 12 MiB to 768 MiB of q, k and v, decoding steps over
4K and 32K cached keys, a causal window through flex), four ways, interleaved round by round in one process, each
timed as ``--calls`` calls issued back to back between two CUDA events (what a model sees: the host's work overlaps
earlier kernels, and a look's wait drains the queue), median of ``--rounds``:

- ``sdpa``: ``F.scaled_dot_product_attention`` alone (flex compiled with torch's block mask for the window);
- ``off``: ``attnkit.attention`` inside ``nan_rule(False)``;
- ``kernels``: the rule without a look (``DEVICE_LOOK_MIN_BYTES`` = inf): seven kernels, no wait;
- ``look``: the rule looking first (``DEVICE_LOOK_MIN_BYTES`` = 0): one look at the output or at q, k and v, one wait.

Prints a markdown table and writes ``--out`` (atomically) with the device and versions.

    PYTHONPATH=src python3 benchmarks/gpu_nan_rule.py --out $OUT/nan_rule.json
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

import attnkit
from attnkit._files import write_json
from attnkit.bench.harness import cuda_back_to_back_ms, finish_gpu_report, gpu_report
from attnkit.functional import nan

H, E = 32, 128
CASES = [  # name, B, L, S, attnkit keyword arguments
    *[(f"causal {n}", 1, n, n, {"is_causal": True}) for n in (512, 1024, 2048, 4096, 16384)],
    ("dense 4096", 1, 4096, 4096, {}),
    ("causal 4096, B 8", 8, 4096, 4096, {"is_causal": True}),
    *[(f"decoding step over {s}", 1, 1, s, {"is_causal": True, "causal_align": "bottom-right"}) for s in (4096, 32768)],
    ("causal window 1024 at 16384", 1, 16384, 16384, {"window": 1024}),
]
WAYS = ("sdpa", "off", "kernels", "look")


def _baseline(B: int, L: int, S: int, kwargs: dict):
    if "window" not in kwargs:
        causal = kwargs.get("is_causal", False) and L == S
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    window = kwargs["window"]
    block_mask = create_block_mask(lambda b, h, i, j: (j <= i) & (i - j < window), None, None, L, S, device="cuda")
    compiled = torch.compile(flex_attention)
    return lambda q, k, v: compiled(q, k, v, block_mask=block_mask)


def _way(way: str, kwargs: dict, baseline):
    if way == "sdpa":
        return baseline
    threshold = {"off": math.inf, "kernels": math.inf, "look": 0}[way]

    def call(q, k, v):
        saved, nan.DEVICE_LOOK_MIN_BYTES = nan.DEVICE_LOOK_MIN_BYTES, threshold
        try:
            with attnkit.nan_rule(way != "off"):
                return attnkit.attention(q, k, v, **kwargs).output
        finally:
            nan.DEVICE_LOOK_MIN_BYTES = saved

    return call


def rows(cases, calls: int, rounds: int, progress, save, found: list[dict]) -> list[dict]:
    for name, B, L, S, kwargs in cases:
        torch.manual_seed(0)
        q = torch.randn(B, H, L, E, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, H, S, E, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        baseline = _baseline(B, L, S, kwargs)
        runs = {way: _way(way, kwargs, baseline) for way in WAYS}
        times: dict[str, list[float]] = {way: [] for way in WAYS}
        with torch.no_grad():
            for _ in range(rounds):  # interleaved: a drift of the machine's speed hits every way alike
                for way, call in runs.items():
                    times[way].append(1000 * cuda_back_to_back_ms(lambda call=call: call(q, k, v), calls))
        row = {"case": name, "B": B, "H": H, "L": L, "S": S, "E": E, "qkv_mib": (q.nbytes + k.nbytes + v.nbytes) / 2**20,
               "calls": calls, "rounds": rounds,
               **{f"{way}_us": statistics.median(ts) for way, ts in times.items()}, "raw_us": times}
        row["look_saves_us"] = row["kernels_us"] - row["look_us"]
        found.append(row)
        save()
        progress.update()
    return found


def markdown(report: dict) -> str:
    lines = ["| case | q+k+v MiB | SDPA us | rule off us | rule, kernels us | rule, look first us | look saves us "
             "| kernels / SDPA | look / SDPA |", "|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['case']} | {r['qkv_mib']:.0f} | {r['sdpa_us']:.1f} | {r['off_us']:.1f} | {r['kernels_us']:.1f} "
                     f"| {r['look_us']:.1f} | {r['look_saves_us']:.1f} | {r['sdpa_us'] / r['kernels_us']:.2f}x "
                     f"| {r['sdpa_us'] / r['look_us']:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20, help="calls back to back per measure")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cases", nargs="*", help="names of CASES to run (default: all)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu" / "nan_rule.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/gpu_nan_rule.py needs a CUDA GPU", file=sys.stderr)
        return 2
    cases = [case for case in CASES if not args.cases or case[0] in args.cases]
    report = gpu_report(threshold_mib=nan.DEVICE_LOOK_MIN_BYTES / 2**20, rows=[])
    with tqdm(total=len(cases), desc="nan rule", unit="case") as progress:
        rows(cases, args.calls, args.rounds, progress, lambda: write_json(args.out, report), report["rows"])
    finish_gpu_report(args.out, report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
