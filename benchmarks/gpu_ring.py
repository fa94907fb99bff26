"""One ring step of context-parallel attention on a GPU: the per-step times that
docs/distributed.md's arithmetic for 8 GPUs x 128K and 64 GPUs x 1M tokens needs.

A ring step is this rank's queries against one key/value shard: the block's fused kernel calls
(:func:`attnkit.distributed.ring._forward_step`, which merges into the running output by
log-sum-exp) and its backward (``_backward_step``). One GPU runs the step that rank 0 of a zigzag
ring of ``--world`` ranks computes, for shard s = n / world, with Llama-3-8B's heads (32 query heads,
8 key/value heads, E = 128, bf16, batch 1):

- ``diagonal``: rank 0's own shard (two causal triangles and one whole chunk pair);
- ``other``: rank 1's shard (two whole chunk pairs; a zigzag ring gives every step the same work);
- rows ``tiles``: the same step cut into 1,024-query tiles with a mask each (what the ring did
  before it called the kernel once per whole run pair), for comparison;
- ``sdpa``: ``scaled_dot_product_attention`` over the same queries and keys with the same causal
  rule where it is one call (no log-sum-exp, no merge): the kernel-only floor.

A rank's attention per layer takes about ``world`` steps (transfers overlap the blocks); the
table sets that against one GPU's causal attention over the whole sequence where it fits.
Writes ``--out`` (default benchmarks/results/gpu/ring.json, atomically) and prints a table.

    python benchmarks/gpu_ring.py                        # n = 131072 on 8 ranks: s = 16,384
    python benchmarks/gpu_ring.py --n 1048576 --world 64  # the same shard size
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F


def _zigzag(rank: int, world: int, n: int, device) -> torch.Tensor:
    chunk = n // (2 * world)
    first, second = rank * chunk, (2 * world - 1 - rank) * chunk
    return torch.cat([torch.arange(first, first + chunk), torch.arange(second, second + chunk)]).to(device)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=131072)
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--single", action="store_true", help="also time one GPU's causal attention over all n tokens")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu" / "ring.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("this benchmark needs a CUDA device")

    from attnkit._files import write_json
    from attnkit._markdown import markdown_table
    from attnkit.bench.harness import cuda_median_ms, machine_info
    from attnkit.distributed import ring
    from attnkit.functional.heads import repeat_kv

    device, dtype = "cuda", torch.bfloat16
    H, Hkv, E = 32, 8, 128
    s = args.n // args.world
    scale = E ** -0.5
    generator = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(1, H, s, E, device=device, dtype=dtype, generator=generator)
    k, v = (torch.randn(1, Hkv, s, E, device=device, dtype=dtype, generator=generator) for _ in range(2))
    ke, ve = (repeat_kv(x, H // Hkv) for x in (k, v))  # as the ring expands them each step
    d_out = torch.randn_like(q)
    q_pos = _zigzag(0, args.world, args.n, device)
    rows = []
    report = {"benchmark": "gpu_ring", "config": vars(args) | {"out": str(args.out), "shard": s, "heads": [H, Hkv, E],
                                                              "dtype": "bfloat16"},
              "machine": machine_info(device), "rows": rows}

    def flops(k_pos: torch.Tensor) -> float:
        """4 x E x (allowed causal pairs) x H: QK^T and PV of the pairs the kernel cannot skip."""
        pairs = int((q_pos[:, None] >= k_pos[None, :]).sum())
        return 4.0 * E * pairs * H

    for name, other in (("diagonal", 0), ("other", 1)):
        k_pos = _zigzag(other, args.world, args.n, device)
        out = torch.zeros(1, H, s, E, device=device)
        lse = torch.full((1, H, s), float("-inf"), device=device)

        def forward():
            out.zero_()
            lse.fill_(float("-inf"))
            ring._forward_step(q, ke, ve, q_pos, k_pos, scale, True, None, None, out, lse)

        forward()
        safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
        merged = out.clone()

        def backward():
            dq = torch.zeros(q.shape, device=device)
            ring._backward_step(d_out, q, ke, ve, merged, safe, q_pos, k_pos, scale, True, None, None, dq)

        work = flops(k_pos)
        for blocks, pairs in (("whole runs", ring.WHOLE_RUN_PAIRS), ("tiles", 0)):
            ring.WHOLE_RUN_PAIRS = pairs
            try:
                for direction, run, factor in (("forward", forward, 1.0), ("backward", backward, 2.5)):
                    ms = cuda_median_ms(run, args.repeats)
                    rows.append({"step": name, "blocks": blocks, "pass": direction, "ms": ms,
                                 "tflops": factor * work / ms / 1e9})
                    print(f"  {name:<8} {blocks:<10} {direction:<8} {ms:9.2f} ms  {rows[-1]['tflops']:6.1f} TFLOP/s", flush=True)
                    write_json(args.out, report)
            finally:
                ring.WHOLE_RUN_PAIRS = 16
        if name == "other":  # rank 0's late chunk attends both of rank 1's chunks: the floor is SDPA over them
            c = s // 2
            ms = cuda_median_ms(lambda: F.scaled_dot_product_attention(q[:, :, c:], k, v, scale=scale, enable_gqa=True),
                                args.repeats)
            rows.append({"step": name, "blocks": "sdpa (the same pairs, no merge)", "pass": "forward", "ms": ms,
                         "tflops": work / ms / 1e9})
            print(f"  {name:<8} sdpa floor forward {ms:9.2f} ms", flush=True)
    if args.single:
        qa = torch.randn(1, H, args.n, E, device=device, dtype=dtype, generator=generator)
        ka, va = (torch.randn(1, Hkv, args.n, E, device=device, dtype=dtype, generator=generator) for _ in range(2))
        ms = cuda_median_ms(lambda: F.scaled_dot_product_attention(qa, ka, va, is_causal=True, enable_gqa=True),
                            max(2, args.repeats // 2))
        rows.append({"step": f"one GPU, all {args.n} tokens", "blocks": "sdpa causal", "pass": "forward", "ms": ms,
                     "tflops": 4.0 * E * args.n * (args.n + 1) / 2 * H / ms / 1e9})
        print(f"  one GPU causal sdpa over {args.n}: {ms:.1f} ms", flush=True)
    report["kv_bytes_per_step"] = 2 * s * Hkv * E * 2
    write_json(args.out, report)
    print("\n".join(markdown_table(["step", "blocks", "pass", "ms", "TFLOP/s"],
                                   [[r["step"], r["blocks"], r["pass"], f"{r['ms']:.2f}", f"{r['tflops']:.0f}"] for r in rows])))
    print(f"k/v bytes per step: {report['kv_bytes_per_step'] / 2**20:.0f} MiB; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
