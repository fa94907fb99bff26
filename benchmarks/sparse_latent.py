"""DeepSeek sparse attention (DSA) against dense causal attention on the CPU: time and peak memory of one
forward of DeepSeek-V3.2's attention shape, absorbed (the latent attended as one key head: queries of
kv_lora_rank + qk_rope_head_dim, values of kv_lora_rank), at 4K-32K tokens.

    dense   attnkit.attention(is_causal=True), every earlier key (backend auto: SDPA's fused kernel)
    dsa     attnkit.functional.topk.topk_attention over the top-k keys each query selected, the indexer's
            selection given (random causal top-k: its cost is the attention's, not the indexer's; random is
            the worst case for the union of a block's selections, which the CPU scores in one GEMM)
    indexer the LightningIndexer's selection itself (its own small heads scoring every earlier key, by blocks)

Memory: one call in a fresh process, peak resident set above what was held (the inputs included in
neither). Target: DSA's memory grows with k, not with S.

    python benchmarks/sparse_latent.py [--sizes 4096 8192 16384 32768] [--topk 2048] [--heads 16]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from attnkit._files import write_json
from attnkit.bench import machine_info
from attnkit.bench.harness import peak_extra_mb, run_worker, serve_worker, time_round_robin

LATENT, ROPE = 512, 64  # DeepSeek-V3.2's kv_lora_rank and qk_rope_head_dim
INDEX_HEADS, INDEX_DIM = 64, 128


def _inputs(n: int, heads: int, topk: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, n, LATENT + ROPE, generator=generator) * 0.05
    k = torch.randn(1, 1, n, LATENT + ROPE, generator=generator) * 0.05
    v = k[..., :LATENT]
    # top-k earlier keys per query: random scores, the causal future excluded (as the indexer never picks it),
    # by blocks of queries so that no n x n matrix is made
    blocks = []
    for start in range(0, n, 1024):
        rows = torch.arange(start, min(n, start + 1024))[:, None]
        scores = torch.rand(len(rows), n, generator=generator).masked_fill(torch.arange(n)[None, :] > rows, -1.0)
        picked = scores.topk(min(topk, n), dim=-1)
        blocks.append(picked.indices.masked_fill(picked.values < 0, -1))
    indices = torch.cat(blocks)[None]
    return q, k, v, indices


def _call(kind: str, n: int, heads: int, topk: int):
    import attnkit
    from attnkit.functional.topk import topk_attention
    from attnkit.layers import LightningIndexer

    if kind == "indexer":
        indexer = LightningIndexer(LATENT, 1536, num_heads=INDEX_HEADS, head_dim=INDEX_DIM, rope_dim=ROPE, topk=topk)
        x, latent = torch.randn(1, n, LATENT) * 0.05, torch.randn(1, n, 1536) * 0.05
        positions = torch.arange(n)
        keys = indexer.keys(x, positions)
        return lambda: indexer.select(latent, x, keys, positions)
    q, k, v, indices = _inputs(n, heads, topk)
    scale = (128 + ROPE) ** -0.5
    if kind == "dense":
        return lambda: attnkit.attention(q, k, v, is_causal=True, scale=scale).output
    return lambda: topk_attention(q, k, v, indices, is_causal=True, scale=scale).output


def worker(spec: dict) -> dict:
    torch.set_num_threads(spec["threads"])
    with torch.no_grad():
        run = _call(spec["kind"], spec["n"], spec["heads"], spec["topk"])
        run()  # warm-up
        return {"peak_mb": peak_extra_mb(run)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192, 16384, 32768])
    parser.add_argument("--topk", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16, help="query heads (DeepSeek-V3.2 has 128; 16 keep it short)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=3, help="timed calls of each, at least")
    parser.add_argument("--indexer-max", type=int, default=8192,
                        help="time the indexer up to this n (it scores every earlier key: L x S work on the CPU)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sparse_latent.json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return serve_worker(args.worker, worker)
    torch.set_num_threads(args.threads)
    rows = []
    print(f"{'n':>7} {'dense ms':>10} {'dsa ms':>9} {'indexer ms':>11} {'dense MB':>9} {'dsa MB':>8} {'indexer MB':>11}")
    for n in args.sizes:
        kinds = ("dense", "dsa", "indexer") if n <= args.indexer_max else ("dense", "dsa")
        with torch.no_grad():
            calls = {kind: _call(kind, n, args.heads, args.topk) for kind in kinds}
            times = time_round_robin(calls, repeats=args.repeats, min_seconds=0.0, warmup_seconds=0.0)
        memory = {kind: run_worker(__file__, {"kind": kind, "n": n, "heads": args.heads, "topk": args.topk,
                                              "threads": args.threads}, timeout=900) for kind in calls}
        row = {"n": n, "topk": args.topk, "heads": args.heads, "repeats": args.repeats,
               **{f"{kind}_ms": 1e3 * times[kind]["time_s"] for kind in calls},
               **{f"{kind}_mb": memory[kind].get("peak_mb") for kind in calls},
               **{f"{kind}_error": memory[kind]["error"] for kind in calls if "error" in memory[kind]}}
        rows.append(row)
        cell = {kind: (f"{row[f'{kind}_ms']:.1f}", "-" if row.get(f"{kind}_mb") is None else f"{row[f'{kind}_mb']:.0f}")
                for kind in calls} | ({} if "indexer" in calls else {"indexer": ("-", "-")})
        print(f"{n:>7} {cell['dense'][0]:>10} {cell['dsa'][0]:>9} {cell['indexer'][0]:>11} {cell['dense'][1]:>9} "
              f"{cell['dsa'][1]:>8} {cell['indexer'][1]:>11}", flush=True)
        write_json(args.out, {"benchmark": "sparse_latent", "machine": machine_info(), "latent": LATENT, "rope": ROPE,
                              "rows": rows, "command": " ".join(["python", "benchmarks/sparse_latent.py", *(argv or sys.argv[1:])])})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
