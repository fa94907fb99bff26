"""The gated delta rule on the CPU against transformers' own and against softmax attention.

Qwen3-Next's linear-attention shape: B 1, 16 heads of 128 (keys and values), chunk 64, float32, q and k
L2-normalised in the kernel, g and beta drawn as the model's gates make them. Rows, at each length:

    gdr-attnkit        attnkit.functional.linear.gated_delta_rule (chunked)
    gdr-transformers   transformers' torch_chunk_gated_delta_rule (Qwen3-Next's reference PyTorch path)
    sdpa-causal        attnkit.attention(is_causal=True) at the same shape (softmax, what a full layer costs)

Time: forward (no grad) and forward+backward, round robin within one process (benchmarks' harness), the
median. Memory: one forward in a fresh process, the peak resident set above what was held (inputs and output
excluded: "beyond the output"). Decoding: one token's step from a carried state (the linear layer's whole
cache), as attnkit's layer and transformers' recurrent rule take it, against SDPA decoding steps over 1K and 64K
cached keys (the 64K step timed apart: its gigabyte would leave the small calls a cold cache).

    python benchmarks/linear_attention.py [--sizes 4096 16384 65536] [--sdpa-max 16384] [--out ...]

Target: attnkit >= 2x transformers at every length, forward and forward+backward; memory beyond the
output O(L x chunk).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from attnkit._files import write_json
from attnkit.bench import machine_info
from attnkit.bench.harness import in_mode, peak_extra_mb, run_worker, serve_worker, time_round_robin

H, E, CHUNK = 16, 128, 64


def _inputs(n: int, grad: bool = False, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, H, n, E, generator=generator) for _ in range(3))
    g = -torch.nn.functional.softplus(torch.randn(1, H, n, generator=generator)) * 0.2  # Qwen3-Next: -A softplus(a + dt)
    beta = torch.rand(1, H, n, generator=generator)
    tensors = [q, k, v, g, beta]
    return [x.requires_grad_(grad) for x in tensors]


def _call(kind: str, n: int, mode: str):
    import attnkit
    from attnkit.functional.linear import gated_delta_rule

    q, k, v, g, beta = _inputs(n, grad=mode == "fwd+bwd")
    if kind == "gdr-attnkit":
        def run():
            return gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, chunk_size=CHUNK).output
    elif kind == "gdr-transformers":
        from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

        def t(x):
            return x.transpose(1, 2)

        def run():
            return t(torch_chunk_gated_delta_rule(t(q), t(k), t(v), t(g), t(beta), chunk_size=CHUNK,
                                                  use_qk_l2norm_in_kernel=True)[0])
    else:
        def run():
            return attnkit.attention(q, k, v, is_causal=True).output
    return in_mode(run, mode)


def decode_rows(threads: int) -> list[dict]:
    """One token: the gated delta rule's step from a carried (K x V) state, as the layer calls it (its g and beta in
    range by construction: ``check_values=False``) and as transformers' Qwen3-Next decodes without
    flash-linear-attention (``torch_recurrent_gated_delta_rule``), beside SDPA steps over 1K and 64K cached keys. The
    64K step is timed in a round robin of its own: its 1 GiB of keys and values, read between the small calls,
    leaves them a cold cache (timed beside it, a 0.32 ms step measured 0.90 ms and the 1K step 1.07 ms for 0.53:
    benchmarks/linear_attention.py)."""
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule

    import attnkit
    from attnkit.functional.linear import gated_delta_rule

    q, k, v, g, beta = _inputs(1)
    state = torch.randn(1, H, E, E) * 0.01

    def t(x):
        return x.transpose(1, 2)

    def sdpa_step(cached: int):
        keys, values = torch.randn(1, H, cached, E), torch.randn(1, H, cached, E)
        return lambda: attnkit.attention(q, keys, values, is_causal=True, causal_align="bottom-right")

    groups = [
        {"gdr step (any position)": lambda: gated_delta_rule(q, k, v, g, beta, initial_state=state,
                                                             output_final_state=True, use_qk_l2norm=True,
                                                             check_values=False),
         "gdr step, transformers' recurrent rule": lambda: torch_recurrent_gated_delta_rule(
             t(q), t(k), t(v), t(g), t(beta), initial_state=state, output_final_state=True,
             use_qk_l2norm_in_kernel=True),
         "sdpa step at 1024": sdpa_step(1024)},
        {"sdpa step at 65536": sdpa_step(65536)},
    ]
    rows = []
    with torch.no_grad():
        for calls in groups:
            times = time_round_robin(calls, repeats=20, min_seconds=0.5)
            rows += [{"row": name, "ms": 1e3 * t["time_s"]} for name, t in times.items()]
    return rows


def worker(spec: dict) -> dict:
    torch.set_num_threads(spec["threads"])
    call = _call(spec["kind"], spec["n"], "fwd")
    call()  # warm-up
    return {"peak_mb": peak_extra_mb(call)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384, 65536])
    parser.add_argument("--sdpa-max", type=int, default=16384, help="softmax rows up to this length (it is quadratic)")
    parser.add_argument("--modes", nargs="+", default=["fwd", "fwd+bwd"], choices=["fwd", "fwd+bwd"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "linear_attention.json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return serve_worker(args.worker, worker)
    torch.set_num_threads(args.threads)
    report: dict = {"benchmark": "linear_attention", "machine": machine_info(), "shape": {"B": 1, "H": H, "K": E, "V": E,
                    "chunk": CHUNK, "dtype": "float32"}, "threads": args.threads, "rows": [],
                    "command": " ".join(["python", "benchmarks/linear_attention.py", *(argv or sys.argv[1:])])}
    print(f"{'n':>6} {'mode':>8} {'attnkit ms':>11} {'transformers ms':>16} {'ratio':>6} {'sdpa ms':>9}")
    for n in args.sizes:
        for mode in args.modes:
            kinds = ["gdr-attnkit", "gdr-transformers"] + (["sdpa-causal"] if n <= args.sdpa_max else [])
            calls = {kind: _call(kind, n, mode) for kind in kinds}
            times = time_round_robin(calls, repeats=args.repeats, min_seconds=0.0, warmup_seconds=0.0)
            row = {"n": n, "mode": mode, **{f"{kind}_ms": 1e3 * times[kind]["time_s"] for kind in kinds}}
            row["speedup_vs_transformers"] = row["gdr-transformers_ms"] / row["gdr-attnkit_ms"]
            if mode == "fwd":
                for kind in ("gdr-attnkit", "gdr-transformers"):
                    memory = run_worker(__file__, {"kind": kind, "n": n, "threads": args.threads}, timeout=1800)
                    row[f"{kind}_peak_extra_mb"] = memory.get("peak_mb")
            report["rows"].append(row)
            sdpa = f"{row['sdpa-causal_ms']:.0f}" if "sdpa-causal_ms" in row else "-"
            print(f"{n:>6} {mode:>8} {row['gdr-attnkit_ms']:>11.0f} {row['gdr-transformers_ms']:>16.0f} "
                  f"{row['speedup_vs_transformers']:>5.2f}x {sdpa:>9}", flush=True)
            write_json(args.out, report)
    report["decode"] = decode_rows(args.threads)
    for row in report["decode"]:
        print(f"decode: {row['row']:<28} {row['ms']:.3f} ms")
    write_json(args.out, report)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
