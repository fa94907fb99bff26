"""What a gathered score costs against a GEMM score in DeepSeek sparse attention's two ways of attending a
block of queries (attnkit.functional.topk): per query (each query's k selected keys gathered, then scored)
and over the union (the block's union of selections gathered once, scored in one GEMM, masked per query).
Both ways are forced on the same call, a selection of k random keys out of S for every query (no causality),
so that the union is nearly S; the ratio

    R(G) = (per-query time / (L x k)) / (union time / (L x S))

is what one gathered score costs in GEMM scores, G query heads sharing one key head. topk_attention takes the
union where it holds at most k x R(G) keys; `_union_limit` is the fit R(G) = 1 + 32 / G.

    python benchmarks/topk_union_cost.py [--groups 1 8 32 128] [--queries 512] [--keys 8192] [--topk 2048]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from attnkit._files import write_json
from attnkit.bench import machine_info
from attnkit.bench.harness import time_round_robin
from attnkit.functional import topk

LATENT, ROPE = 512, 64  # DeepSeek-V3.2's absorbed shape: keys of 576, values their first 512


def _forced(limit: float):
    """topk_attention with its cost rule replaced: every block over the union (a limit of S: the union blocks
    are then as large as topk_attention makes them for a union of S keys) or per query (-1)."""
    def call(q, k, v, indices):
        rule = topk._union_limit
        topk._union_limit = lambda slots, groups: limit
        try:
            return topk.topk_attention(q, k, v, indices).output
        finally:
            topk._union_limit = rule
    return call


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, nargs="+", default=[1, 8, 32, 128], help="query heads a key head")
    parser.add_argument("--queries", type=int, default=512)
    parser.add_argument("--keys", type=int, default=8192)
    parser.add_argument("--topk", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "topk_union_cost.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    L, S, K = args.queries, args.keys, args.topk
    rows = []
    print(f"{'G':>4} {'per-query ms':>13} {'union ms':>9} {'R(G)':>6} {'1 + 32/G':>9} {'max diff':>9}")
    for groups in args.groups:
        q = torch.randn(1, groups, L, LATENT + ROPE, generator=generator) * 0.05
        k = torch.randn(1, 1, S, LATENT + ROPE, generator=generator) * 0.05
        v = k[..., :LATENT]
        indices = torch.rand(1, L, S, generator=generator).topk(K, dim=-1).indices
        each, union = _forced(-1), _forced(float(S))
        with torch.no_grad():
            diff = (each(q, k, v, indices) - union(q, k, v, indices)).abs().max().item()
            times = time_round_robin({"each": lambda: each(q, k, v, indices), "union": lambda: union(q, k, v, indices)},
                                     repeats=args.repeats, min_seconds=0.0, warmup_seconds=0.0)
        each_s, union_s = times["each"]["time_s"], times["union"]["time_s"]
        ratio = (each_s / (L * K)) / (union_s / (L * S))
        rows.append({"groups": groups, "queries": L, "keys": S, "topk": K, "per_query_ms": 1e3 * each_s,
                     "union_ms": 1e3 * union_s, "ratio": ratio, "rule": 1 + 32 / groups, "max_abs_diff": diff})
        print(f"{groups:>4} {1e3 * each_s:>13.1f} {1e3 * union_s:>9.1f} {ratio:>6.2f} {1 + 32 / groups:>9.2f} {diff:>9.1e}",
              flush=True)
        write_json(args.out, {"benchmark": "topk_union_cost", "machine": machine_info(), "rows": rows,
                              "command": " ".join(["python", "benchmarks/topk_union_cost.py", *(argv or sys.argv[1:])])})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
