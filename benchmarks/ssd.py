"""Mamba-2's state-space layer (SSD) on the CPU: attnkit's against transformers' own.

Mamba-2-2.7B's layer shape (d_model 2560, expand 2): B 1, 80 heads of 64 channels, one group of B and C with a
state of 128, float32, steps and decays as the layer makes them (dt + dt_bias, softplus; A = -exp(A_log)). Rows, at
each length:

    attnkit          attnkit.functional.linear.ssd at its default chunk (64)
    attnkit-256      the same at the checkpoint's chunk_size (256)
    transformers     transformers' mamba2_chunk_scan at the checkpoint's chunk_size, 256: the scan its
                     Mamba2Mixer.forward runs on a CPU (mamba_ssm's kernels need CUDA)
    transformers-64  the same at attnkit's chunk (64)

The chunk changes no number beyond rounding: every row computes the same exact scan (the test suite holds
attnkit's to a float64 recurrence and to transformers'). The projections, convolution and norm around the scan
are one matmul each, the same in both libraries, and are left out.

Time: forward (no grad) and forward+backward (gradients of x, dt, B and C), round robin within one process
(benchmarks' harness), the median. Memory: one forward in a fresh process, the peak resident set above what was
held.

    python benchmarks/ssd.py [--sizes 4096 16384] [--out benchmarks/results/ssd.json]

Target: attnkit >= 2x transformers (its checkpoint's chunk) at 4K and 16K, forward and forward+backward.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch

from attnkit._files import write_json
from attnkit.bench import machine_info
from attnkit.bench.harness import in_mode, peak_extra_mb, run_worker, serve_worker, time_round_robin

H, P, N, G = 80, 64, 128, 1
KINDS = {"attnkit": ("attnkit", 64), "attnkit-256": ("attnkit", 256), "transformers": ("transformers", 256),
         "transformers-64": ("transformers", 64)}


def _inputs(n: int, grad: bool = False, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(1, H, n, P, generator=generator)
    dt = torch.randn(1, H, n, generator=generator) - 2.0  # softplus(dt + dt_bias) around 0.1, as trained layers
    B, C = (torch.randn(1, G, n, N, generator=generator) for _ in range(2))
    A = -torch.exp(torch.rand(H, generator=generator) * 2.8)  # A_log in [0, log 16]: Mamba-2's initialisation range
    D, dt_bias = torch.ones(H), torch.rand(H, generator=generator)
    return [t.requires_grad_(grad) for t in (x, dt, B, C)] + [A, D, dt_bias]


def _call(kind: str, n: int, mode: str):
    library, chunk = KINDS[kind]
    x, dt, B, C, A, D, dt_bias = _inputs(n, grad=mode == "fwd+bwd")
    if library == "attnkit":
        from attnkit.functional.linear import ssd

        def run():
            return ssd(x, dt, A, B, C, D=D, dt_bias=dt_bias, chunk_size=chunk, check_values=False).output
    else:
        from transformers.models.mamba2.modeling_mamba2 import mamba2_chunk_scan

        def t(tensor):
            return tensor.transpose(1, 2)

        def run():
            return mamba2_chunk_scan(t(x), t(dt), A, t(B), t(C), chunk_size=chunk, D=D, dt_bias=dt_bias,
                                     dt_softplus=True)
    return in_mode(run, mode)


def worker(spec: dict) -> dict:
    torch.set_num_threads(spec["threads"])
    warnings.filterwarnings("ignore")  # transformers' note that mamba_ssm is not installed
    call = _call(spec["kind"], spec["n"], "fwd")
    call()  # warm-up
    return {"peak_mb": peak_extra_mb(call)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--modes", nargs="+", default=["fwd", "fwd+bwd"], choices=["fwd", "fwd+bwd"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "ssd.json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return serve_worker(args.worker, worker)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    report: dict = {"benchmark": "ssd", "machine": machine_info(), "threads": args.threads, "rows": [],
                    "shape": {"B": 1, "H": H, "P": P, "N": N, "G": G, "dtype": "float32",
                              "model": "Mamba-2-2.7B (d_model 2560, expand 2, head_dim 64, state 128, 1 group)"},
                    "chunks": {kind: chunk for kind, (_, chunk) in KINDS.items()},
                    "command": " ".join(["python", "benchmarks/ssd.py", *(argv or sys.argv[1:])])}
    header = " ".join(f"{kind + ' ms':>18}" for kind in KINDS)
    print(f"{'n':>6} {'mode':>8} {header} {'speedup':>8}")
    for n in args.sizes:
        for mode in args.modes:
            calls = {kind: _call(kind, n, mode) for kind in KINDS}
            times = time_round_robin(calls, repeats=args.repeats, min_seconds=0.0, warmup_seconds=0.0)
            row = {"n": n, "mode": mode, **{f"{kind}_ms": 1e3 * times[kind]["time_s"] for kind in KINDS}}
            row["speedup_vs_transformers"] = row["transformers_ms"] / row["attnkit_ms"]
            row["speedup_same_chunk_256"] = row["transformers_ms"] / row["attnkit-256_ms"]
            row["speedup_same_chunk_64"] = row["transformers-64_ms"] / row["attnkit_ms"]
            if mode == "fwd":
                for kind in ("attnkit", "transformers"):
                    memory = run_worker(__file__, {"kind": kind, "n": n, "threads": args.threads}, timeout=1800)
                    row[f"{kind}_peak_extra_mb"] = memory.get("peak_mb")
            report["rows"].append(row)
            cells = " ".join(f"{row[kind + '_ms']:>18.0f}" for kind in KINDS)
            print(f"{n:>6} {mode:>8} {cells} {row['speedup_vs_transformers']:>7.2f}x", flush=True)
            write_json(args.out, report)
    write_json(args.out, report)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
