"""What the ranks' agreement check costs context-parallel attention: the same calls with the check
(one all_gather of 15 int64 per call, attnkit.distributed.group.check_agreement) and with it switched
off, in one run, W = 2 gloo processes on this machine.

Inputs: B = 1, H = 8, E = 64, causal, zigzag ring, float32, n tokens in all (n / 2 per process).
Time: median over repeats of one forward call, measured on rank 0 after a warm-up.

Usage:
    python benchmarks/rank_agreement.py                       # n = 256, 2048, 16384
    python benchmarks/rank_agreement.py --sizes 256 --repeats 50
Prints a table and writes benchmarks/results/rank_agreement.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.multiprocessing as mp

from attnkit._files import write_json


def _worker(rank: int, world: int, port: int, sizes: list[int], repeats: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    torch.set_num_threads(1)
    import attnkit.distributed.strategy as cp

    checked = cp.check_agreement
    rows = []
    for n in sizes:
        q = torch.randn(1, 8, n // world, 64, generator=torch.Generator().manual_seed(rank))
        for label, check in (("with check", checked), ("without", lambda *args, **kwargs: None)):
            cp.check_agreement = check
            cp.context_parallel_attention(q, q, q, is_causal=True)  # warm-up
            times = []
            for _ in range(repeats):
                torch.distributed.barrier()
                start = time.perf_counter()
                cp.context_parallel_attention(q, q, q, is_causal=True)
                times.append(time.perf_counter() - start)
            rows.append({"n": n, "check": label, "median_ms": 1000 * statistics.median(times)})
    cp.check_agreement = checked
    if rank == 0:
        results.put(rows)
    torch.distributed.destroy_process_group()
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 2048, 16384])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "rank_agreement.json")
    args = parser.parse_args()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_worker, args=(2, port, args.sizes, args.repeats, results), nprocs=2, join=True,
                       start_method="spawn")
    rows = results.get()
    by = {(r["n"], r["check"]): r["median_ms"] for r in rows}
    print("| n | with check (ms) | without (ms) | extra (ms) | ratio |")
    print("|---|---|---|---|---|")
    for n in args.sizes:
        a, b = by[(n, "with check")], by[(n, "without")]
        print(f"| {n:,} | {a:.3f} | {b:.3f} | {a - b:+.3f} | {a / b:.3f}x |")
    write_json(args.out, {"machine": {"cores": os.cpu_count(), "torch": torch.__version__}, "world": 2,
                          "repeats": args.repeats, "results": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
