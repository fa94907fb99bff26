"""Efficient attention variants against exact attention: approximation error as a function of n
and of the number of features / projected length, and forward time against PyTorch SDPA to find
the length from which each variant is faster. Same run, same inputs.

Inputs: B = 1, H = 8, E = 64, q, k, v ~ N(0, 1) / 2 (float32). Error: mean |out - exact| /
mean |exact|, exact = softmax attention (non-causal). Linear attention (elu+1) is a different
kernel, not an estimate of softmax, and Linformer's projections here are random (untrained):
their error columns show how far they are from softmax attention, not the quality of a trained
model. Time: median of repeats after a warm-up, functional forms only (no projections).

Usage:
    python benchmarks/efficient.py                  # n = 512 .. 16K
    python benchmarks/efficient.py --sizes 512 1024 --repeats 3
Prints tables, writes JSON and two PNG plots (default benchmarks/results/efficient.*).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from attnkit._files import write_json
from attnkit.functional.linear import elu_feature_map, favor_features, linear_attention, orthogonal_projection

H, E = 8, 64


def _inputs(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, H, n, E, generator=g) * 0.5 for _ in range(3))


def projection(features: int) -> torch.Tensor:
    """The Performer's random features, drawn once (as the layer keeps them in a buffer)."""
    return orthogonal_projection(features, E, generator=torch.Generator().manual_seed(1))


def performer(q, k, v, w: torch.Tensor):
    return linear_attention(favor_features(q, w, is_query=True), favor_features(k, w, is_query=False), v)


def linformer(q, k, v, projected: int):
    n = k.shape[2]
    g = torch.Generator().manual_seed(2)
    proj_k = torch.randn(projected, n, generator=g) / n**0.5
    proj_v = torch.randn(projected, n, generator=g) / n**0.5
    return F.scaled_dot_product_attention(q, proj_k @ k, proj_v @ v)


def linear(q, k, v):
    return linear_attention(elu_feature_map(q), elu_feature_map(k), v)


def _median_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--features", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "efficient.json")
    args = parser.parse_args(argv)
    errors, timings = [], []
    with torch.no_grad():
        for n in args.sizes:
            q, k, v = _inputs(n)
            exact = F.scaled_dot_product_attention(q, k, v)
            scale = float(exact.abs().mean())
            row = {"n": n, "linear_elu": float((linear(q, k, v) - exact).abs().mean()) / scale}
            for m in args.features:
                row[f"performer_{m}"] = float((performer(q, k, v, projection(m)) - exact).abs().mean()) / scale
                row[f"linformer_{m}"] = float((linformer(q, k, v, m) - exact).abs().mean()) / scale
            errors.append(row)
            m = args.features[-1]
            w = projection(m)
            t = {"n": n, "sdpa": _median_time(lambda: F.scaled_dot_product_attention(q, k, v), args.repeats),
                 "linear_elu": _median_time(lambda: linear(q, k, v), args.repeats),
                 f"performer_{m}": _median_time(lambda: performer(q, k, v, w), args.repeats),
                 f"linformer_{m}": _median_time(lambda: linformer(q, k, v, m), args.repeats)}
            timings.append(t)
            print(f"n={n:6d}  " + "  ".join(f"{key} {value * 1e3:8.2f} ms" for key, value in t.items() if key != "n"),
                  flush=True)
    columns = [c for c in errors[0] if c != "n"]
    print("\nrelative error against exact softmax attention\n| n | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for row in errors:
        print(f"| {row['n']} | " + " | ".join(f"{row[c]:.3f}" for c in columns) + " |")
    names = [c for c in timings[0] if c not in ("n", "sdpa")]
    print("\nforward time, x = SDPA time / variant time (above 1: faster than SDPA)\n| n | sdpa ms | "
          + " | ".join(names) + " |")
    print("|---" * (len(names) + 2) + "|")
    crossover = {}
    for t in timings:
        print(f"| {t['n']} | {t['sdpa'] * 1e3:.2f} | " + " | ".join(f"{t[c] * 1e3:.2f} ms ({t['sdpa'] / t[c]:.2f}x)" for c in names) + " |")
        for c in names:
            if t["sdpa"] > t[c] and c not in crossover:
                crossover[c] = t["n"]
    print("\nfirst n at which the variant is faster than SDPA: "
          + ", ".join(f"{c}: {crossover.get(c, 'not within the sizes')}" for c in names))
    write_json(args.out, {"setup": {"H": H, "E": E, "B": 1, "dtype": "float32", "threads": torch.get_num_threads(),
                                    "torch": torch.__version__}, "errors": errors, "timings": timings,
                          "crossover": crossover})
    try:
        from attnkit.viz import plot_lines
    except ImportError:
        return 0
    ns = [r["n"] for r in errors]
    plot_lines({c: (ns, [r[c] for r in errors]) for c in columns}, args.out.with_name("efficient_error.png"),
               x_title="n", y_title="relative error vs softmax attention", log_x=True, log_y=True,
               title="Approximation error against exact attention")
    plot_lines({c: ([t["n"] for t in timings], [t[c] * 1e3 for t in timings]) for c in ["sdpa", *names]},
               args.out.with_name("efficient_time.png"), x_title="n", y_title="forward ms", log_x=True, log_y=True,
               title="Forward time: exact SDPA vs efficient variants")
    print(f"wrote {args.out} and its PNGs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
