"""Exact dense attention at n = 131,072 on one machine (B = 1, H = 8, E = 64, fp32): the tiled
backend's forward (and, with --causal, causal), one call after a warm-up at 4K, timed with its
peak extra memory (resident-set high-water mark above the inputs). The (n, n) weights alone
would be 512 GiB per call (B x H x n^2 x 4 bytes); SDPA is not run at this n (its CPU kernel
keeps its working set per thread; its times at 4K-64K are in docs/performance.md).

    python benchmarks/long_dense.py [--n 131072] [--causal]
Prints the result and writes JSON (default benchmarks/results/long_dense.json).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=131_072)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "long_dense.json")
    args = parser.parse_args(argv)

    import attnkit
    from attnkit._files import write_json
    from attnkit.bench.harness import machine_info, peak_extra_mb

    def inputs(n):
        generator = torch.Generator().manual_seed(0)
        return [torch.randn(1, args.heads, n, args.head_dim, generator=generator) for _ in range(3)]

    with torch.no_grad():
        small = inputs(4096)
        attnkit.attention(*small, is_causal=args.causal, backend="tiled")  # warm-up: threads, allocator
        q, k, v = inputs(args.n)
        seconds = {}

        def run():
            start = time.perf_counter()
            out = attnkit.attention(q, k, v, is_causal=args.causal, backend="tiled").output
            seconds["call"] = time.perf_counter() - start
            return out

        extra = peak_extra_mb(run)
    input_mb = 3 * q.numel() * 4 / 2**20
    result = {
        "benchmark": "long_dense", "n": args.n, "heads": args.heads, "head_dim": args.head_dim, "causal": args.causal,
        "seconds": seconds["call"], "peak_extra_mb": extra, "inputs_mb": input_mb,
        "weights_if_materialised_gib": args.heads * args.n**2 * 4 / 2**30, "machine": machine_info("cpu"),
    }
    write_json(args.out, result)
    print(f"n = {args.n:,} {'causal' if args.causal else 'dense'}: {seconds['call']:.1f} s, peak extra memory "
          f"{extra:,.0f} MB (inputs {input_mb:,.0f} MB; the weights would be {result['weights_if_materialised_gib']:,.0f} GiB)")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
