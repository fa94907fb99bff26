"""Peak memory of one training step of a transformers model under attnkit.hf.context_parallel, at W = 1, 2, 4
gloo processes on this machine: each rank's peak resident memory above what it held before the step
(forward, loss, backward; the model and optimizer-free), and the step's wall time (W processes share
this machine's cores, so time is not the point here). Writes benchmarks/results/hf_context_parallel.json.

    python benchmarks/hf_context_parallel.py                       # Llama 4 x 256 wide, n = 8192, ring
    python benchmarks/hf_context_parallel.py --length 16384 --method ulysses --worlds 1 2

The model: LlamaForCausalLM, hidden 256, 4 layers, 8 heads (4 key/value), MLP 512, vocabulary 2,000,
fp32, one sequence of ``--length`` tokens, attn_implementation="attnkit". Memory per rank should fall
as 1 / W (activations, logits, the attention blocks), above a floor the model's weights and gradients
set (the same on every rank).
"""

from __future__ import annotations

import argparse
import os
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.multiprocessing as mp

from attnkit._files import write_json
from attnkit.bench import machine_info
from attnkit.bench.harness import peak_extra_mb

OUT = Path(__file__).parent / "results" / "hf_context_parallel.json"


def _model(length: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=2000, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=length)
    return LlamaForCausalLM._from_config(config, attn_implementation="attnkit")


def _rank(rank: int, world: int, port: int, length: int, method: str, results) -> None:
    import attnkit.hf

    try:
        if world > 1:
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=600))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        attnkit.hf.register()
        model = _model(length)
        cp = attnkit.hf.context_parallel(model, method=method)
        ids = torch.randint(0, 2000, (1, length), generator=torch.Generator().manual_seed(1))

        def step(tokens: torch.Tensor) -> None:
            batch = cp.shard(tokens, labels=tokens)
            model(**batch).loss.backward()
            model.zero_grad(set_to_none=False)  # the gradients' memory stays held, as in training

        step(ids[:, : 32 * world])  # warm-up: libraries, the gradient buffers
        started = time.perf_counter()
        peak = peak_extra_mb(lambda: step(ids))
        results.put({"rank": rank, "peak_mb": peak, "seconds": time.perf_counter() - started})
    except Exception:  # noqa: BLE001 - reported to the parent
        results.put({"rank": rank, "error": traceback.format_exc()})
    finally:
        if world > 1:
            torch.distributed.destroy_process_group()


def measure(world: int, length: int, method: str) -> dict:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    processes = mp.start_processes(_rank, args=(world, port, length, method, results), nprocs=world, join=True,
                                   start_method="spawn")
    del processes
    rows = sorted((results.get() for _ in range(world)), key=lambda r: r["rank"])
    errors = [r["error"] for r in rows if "error" in r]
    if errors:
        raise RuntimeError("\n".join(errors))
    return {"world": world, "tokens_per_rank": length // world, "peak_mb_per_rank": [r["peak_mb"] for r in rows],
            "max_peak_mb": max(r["peak_mb"] for r in rows), "seconds": max(r["seconds"] for r in rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--method", default="ring", choices=["ring", "ulysses"])
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    rows = []
    for world in args.worlds:
        row = measure(world, args.length, args.method)
        base = rows[0]["max_peak_mb"] if rows else row["max_peak_mb"]
        row["ratio_to_first"] = row["max_peak_mb"] / base
        rows.append(row)
        print(f"W = {world}: {row['tokens_per_rank']:6d} tokens a rank, peak {row['max_peak_mb']:8.1f} MB a rank "
              f"({row['ratio_to_first']:.2f}x W = {args.worlds[0]}; ranks {[round(m) for m in row['peak_mb_per_rank']]}),"
              f" step {row['seconds']:.1f} s", flush=True)
    write_json(args.out, {"machine": machine_info(), "benchmark": "hf_context_parallel", "length": args.length,
                          "method": args.method, "model": "LlamaForCausalLM 4 x 256, 8 heads / 4 kv, vocab 2000, fp32",
                          "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
