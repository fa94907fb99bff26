"""The NaN rule's device time on CUDA at the sizes its one Triton kernel may take (issue 62; nan_kernel's docstring
called it unmeasured): for each shape, the ways the rule can settle a call, timed in one process, interleaved round by
round, on bf16 inputs without a NaN (the common case):

- ``kernel``: :func:`attnkit.functional.nan_kernel.launch`, one program per (batch, query head), called directly,
  so also past :data:`~attnkit.functional.nan_kernel.PROGRAM_MAX_BYTES`, where attnkit itself runs the seven;
- ``seven``: :func:`attnkit.functional.nan.poisoned_rows` without a look and the ``where`` over the output (what
  attnkit runs where the kernel does not apply);
- ``look``: the three whole-tensor maxima and one wait (what attnkit does from ``DEVICE_LOOK_MIN_BYTES`` on);
- ``sdpa``: the attention the rule follows (``F.scaled_dot_product_attention``, keys repeated per query head for
  grouped shapes, as transformers does), for scale.

Each is timed as calls issued back to back between two CUDA events (throughput: the host's work overlaps earlier
kernels) and as one call alone (latency). ``per_program_mib`` is what one program of the kernel reads, the quantity
PROGRAM_MAX_BYTES bounds.

    PYTHONPATH=src python3 benchmarks/gpu_nan_kernel_sizes.py --out $OUT/nan_kernel_sizes.json
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from attnkit.bench.harness import cuda_back_to_back_ms, cuda_median_ms, finish_gpu_report, gpu_report
from attnkit.functional import nan, nan_kernel
from attnkit.functional.checks import Dims

SHAPES = [  # (name, B, H, Hkv, L, S, E)
    ("decode, 8K keys, 2 kv heads", 1, 16, 2, 1, 8192, 128),
    ("decode, 1K keys", 1, 32, 8, 1, 1024, 128),
    ("decode, 4K keys", 1, 32, 8, 1, 4096, 128),
    ("decode, 16K keys", 1, 32, 8, 1, 16384, 128),
    ("decode B 16, 4K keys", 16, 32, 8, 1, 4096, 128),
    ("prefill 512", 1, 32, 8, 512, 512, 128),
    ("prefill 2K", 1, 32, 8, 2048, 2048, 128),
    ("prefill 4K, 8 heads", 1, 8, 8, 4096, 4096, 128),
    ("tiny", 1, 4, 4, 16, 16, 32),
]


def _ways(q, k, v, out, dims: Dims) -> dict:
    groups = dims.H // dims.Hkv

    def seven():
        poisoned = nan.poisoned_rows(q, k, v, dims)
        return out if poisoned is None else torch.where(poisoned, math.nan, out)

    def look():
        return torch.stack(torch._foreach_max([q, k, v])).tolist()

    kr, vr = (x.repeat_interleave(groups, dim=1) if groups > 1 else x for x in (k, v))
    return {"kernel": lambda: nan_kernel.launch(q, k, v, dims, out), "seven": seven, "look": look,
            "sdpa": lambda: F.scaled_dot_product_attention(q, kr, vr)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50, help="calls a back-to-back timing issues")
    parser.add_argument("--repeats", type=int, default=15, help="single calls a latency timing takes the median of")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu" / "nan_kernel_sizes.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/gpu_nan_kernel_sizes.py needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = torch.bfloat16
    nan.DEVICE_LOOK_MIN_BYTES = math.inf  # poisoned_rows never looks: the seven kernels are timed as such
    rows = []
    with torch.no_grad():
        for name, B, H, Hkv, L, S, E in SHAPES:
            generator = torch.Generator(device="cuda").manual_seed(0)
            q = torch.randn(B, H, L, E, device="cuda", dtype=dtype, generator=generator)
            k, v = (torch.randn(B, Hkv, S, E, device="cuda", dtype=dtype, generator=generator) for _ in range(2))
            out = torch.randn(B, H, L, E, device="cuda", dtype=dtype, generator=generator)
            dims = Dims(B, H, Hkv, L, S, E, E)
            ways = _ways(q, k, v, out, dims)
            cells: dict[tuple[str, str], list[float]] = {}
            for _ in range(args.rounds):
                for way, run in ways.items():
                    cells.setdefault((way, "back_to_back"), []).append(cuda_back_to_back_ms(run, args.calls))
                    cells.setdefault((way, "single"), []).append(cuda_median_ms(run, args.repeats))
            assert not out.isnan().any(), "the kernel wrote NaN over an output of inputs without one"
            row = {"shape": name, "B": B, "H": H, "Hkv": Hkv, "L": L, "S": S, "E": E, "dtype": str(dtype),
                   "qkv_mib": (q.nbytes + k.nbytes + v.nbytes) / 2**20,
                   "per_program_mib": (L * E + S * 2 * E) * q.element_size() / 2**20,
                   "programs": B * H, "within_program_max": (L * E + S * 2 * E) * q.element_size()
                   <= nan_kernel.PROGRAM_MAX_BYTES}
            for (way, timer), ms in cells.items():
                row[f"{way}_{timer}_us"] = 1000 * statistics.median(ms)
                row[f"{way}_{timer}_raw_us"] = [1000 * m for m in ms]
            rows.append(row)
            print(f"{name}: " + ", ".join(f"{w} {row[f'{w}_back_to_back_us']:.1f}/{row[f'{w}_single_us']:.1f} us"
                                          for w in ways), flush=True)
    report = gpu_report(dtype=str(dtype), calls=args.calls, repeats=args.repeats, rounds=args.rounds,
                        program_max_bytes=nan_kernel.PROGRAM_MAX_BYTES, rows=rows)
    lines = ["| shape | q+k+v MiB | a program MiB | programs | kernel us | seven us | look us | SDPA us | "
             "seven / kernel |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['qkv_mib']:.2f} | {r['per_program_mib']:.3f} | {r['programs']} "
                     f"| {r['kernel_back_to_back_us']:.1f} ({r['kernel_single_us']:.1f}) "
                     f"| {r['seven_back_to_back_us']:.1f} ({r['seven_single_us']:.1f}) "
                     f"| {r['look_back_to_back_us']:.1f} ({r['look_single_us']:.1f}) "
                     f"| {r['sdpa_back_to_back_us']:.1f} ({r['sdpa_single_us']:.1f}) "
                     f"| {r['seven_back_to_back_us'] / r['kernel_back_to_back_us']:.2f}x |")
    lines.append("\nback to back (one call alone, in brackets)")
    finish_gpu_report(args.out, report, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
