"""Context-parallel attention on this machine: per-process peak memory, time, bytes sent and the
causal work balance of each layout, for W processes (gloo, spawned) at a fixed sequence length.

Each configuration runs in W fresh processes. A process makes its own random shards (B, H, n / W,
E), warms up once on a short sequence, then runs ``context_parallel_attention`` once: its wall
time, the peak resident memory the call needed above what the process held (the shards
included), and the bytes it posted to the ring (counted at ``_Ring.start``) are recorded and set
against the formula (W - 1) x (k + v + positions) for the forward pass. "Useful pairs" are the
(query, key) pairs the causal mask allows among a rank's queries: their max/min across ranks is
the balance the layout gives a kernel that skips masked blocks (ours does, per 1,024-query tile).
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from dataclasses import asdict, dataclass
from typing import Any

import torch

from .._markdown import markdown_table
from .._progress import progress_bar

__all__ = ["ContextParallelBench", "run_context_parallel", "format_context_parallel"]


@dataclass(frozen=True)
class ContextParallelBench:
    n: int = 32768
    worlds: tuple[int, ...] = (1, 2, 4)
    layouts: tuple[str, ...] = ("zigzag", "contiguous")
    batch: int = 1
    heads: int = 4
    head_dim: int = 64
    causal: bool = True
    backward: bool = False
    timeout_s: float = 900.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, config: ContextParallelBench, layout: str, results) -> None:
    from datetime import timedelta

    from .. import distributed
    from ..distributed import ring
    from .harness import peak_extra_mb

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=600))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    sent = [0]
    start = ring._Ring.start

    def counting(self, tensors):
        sent[0] += sum(t.numel() * t.element_size() for t in tensors)
        return start(self, tensors)

    ring._Ring.start = counting  # type: ignore[method-assign]  # counts the bytes each hop sends
    try:
        c = config
        s = c.n // world
        shape = (c.batch, c.heads, s, c.head_dim)
        q, k, v = (torch.randn(shape, requires_grad=c.backward) for _ in range(3))
        warm = [x[:, :, : 2 * world].detach().clone().requires_grad_(c.backward) for x in (q, k, v)]
        distributed.context_parallel_attention(*warm, is_causal=c.causal, layout=layout)
        sent[0] = 0
        torch.distributed.barrier()
        timing = {}

        def call():
            tick = time.perf_counter()
            out = distributed.context_parallel_attention(q, k, v, is_causal=c.causal, layout=layout).output
            if c.backward:
                out.sum().backward()
            timing["seconds"] = time.perf_counter() - tick

        peak = peak_extra_mb(call)
        positions = distributed.shard_positions(c.n, world, rank, layout)
        pairs = int((positions + 1).sum()) if c.causal else s * c.n
        results.put({"rank": rank, "seconds": timing["seconds"], "peak_mb": peak, "sent_bytes": sent[0],
                     "useful_pairs": pairs})
    except Exception:  # noqa: BLE001 - reported to the parent
        results.put({"rank": rank, "error": traceback.format_exc()})
    finally:
        ring._Ring.start = start  # type: ignore[method-assign]
        torch.distributed.destroy_process_group()
        os._exit(0)  # results went through the queue; gloo can abort in interpreter teardown (torch 2.13)


def _run_one(config: ContextParallelBench, world: int, layout: str) -> dict:
    import torch.multiprocessing as mp

    results = mp.get_context("spawn").SimpleQueue()
    processes = mp.start_processes(_worker, args=(world, _free_port(), config, layout, results), nprocs=world,
                                   join=False, start_method="spawn")
    deadline = time.monotonic() + config.timeout_s
    try:
        while not processes.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"W={world} {layout}: workers did not finish within {config.timeout_s:.0f} s")
    except BaseException:  # a timeout, an error in a worker, or Ctrl-C: the workers go down with the parent
        for p in processes.processes:
            if p.is_alive():
                p.kill()
        raise
    ranks = sorted((results.get() for _ in range(world)), key=lambda r: r["rank"])
    errors = [r["error"] for r in ranks if "error" in r]
    if errors:
        raise RuntimeError("\n".join(errors))
    s, c = config.n // world, config
    element = torch.finfo(torch.float32).bits // 8
    formula = (world - 1) * (2 * c.batch * c.heads * s * c.head_dim * element + s * 8)
    pairs = [r["useful_pairs"] for r in ranks]
    seconds = [r["seconds"] for r in ranks]
    return {"world": world, "layout": layout, "n": c.n, "shard": s, "seconds": max(seconds),
            "rank_seconds": seconds, "rank_peak_mb": [r["peak_mb"] for r in ranks],
            "peak_mb": max(r["peak_mb"] for r in ranks), "rank_sent_bytes": [r["sent_bytes"] for r in ranks],
            "formula_sent_bytes": formula, "rank_useful_pairs": pairs,
            "pair_balance": max(pairs) / max(1, min(pairs)), "time_balance": max(seconds) / min(seconds)}


def run_context_parallel(config: ContextParallelBench, *, progress: bool = True, on_row=None) -> dict:
    """Every (world, layout) of ``config``; ``on_row(report)`` after each, for saving as it goes."""
    from .harness import machine_info

    report: dict[str, Any] = {"config": asdict(config), "machine": machine_info(), "results": []}
    todo = [(w, layout) for w in config.worlds for layout in (config.layouts if w > 1 else config.layouts[:1])]
    with progress_bar(total=len(todo), progress=progress, desc="context parallel", unit="run", leave=True) as shown:
        for world, layout in todo:
            report["results"].append(_run_one(config, world, layout))
            if on_row is not None:
                on_row(report)
            shown.update(1)
    return report


def format_context_parallel(rows: list[dict]) -> str:
    """A markdown table of :func:`run_context_parallel` rows."""
    def cells(r: dict) -> list:
        sent = max(r["rank_sent_bytes"])
        ratio = f"{sent / r['formula_sent_bytes']:.3f}" if r["formula_sent_bytes"] else "- (no ring)"
        return [r["world"], r["layout"], f"{r['shard']:,}", f"{r['seconds']:.2f} s", f"{r['peak_mb']:.0f}",
                f"{sent / 2**20:.1f} MB / {ratio}", f"{r['pair_balance']:.2f}", f"{r['time_balance']:.2f}"]

    header = ["W", "layout", "shard", "time (max rank)", "peak MB per process", "sent / formula", "useful-pair balance",
              "time balance"]
    return "\n".join(markdown_table(header, (cells(r) for r in rows)))
