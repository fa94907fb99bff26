"""attnkit inside transformers: a tiny-width Mistral (sliding window 256) and Llama at long
sequences, forward and forward+backward, attn_implementation "attnkit" against transformers' own
"sdpa" and "eager" on the same weights, timed round-robin in one process; peak extra memory of one
call alongside (each in a fresh process).

Usage:
    python benchmarks/hf.py                              # n = 4096 and 16384
    python benchmarks/hf.py --sizes 4096 --modes fwd
    python benchmarks/hf.py --record 8192                # memory of attnkit.hf.record: one head of one layer
Prints a table and writes JSON (default benchmarks/results/hf.json). Eager is skipped where its
(n, n) weights per head and layer would exceed --max-eager-gb.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

FAMILIES = {
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 256}),
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
}
SHAPE = dict(vocab_size=256, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=256, max_position_embeddings=65536)


def build(family: str, implementation: str):
    import transformers

    import attnkit.hf

    attnkit.hf.register()
    config_name, model_name, extra = FAMILIES[family]
    config = getattr(transformers, config_name)(**SHAPE, **extra)
    torch.manual_seed(0)
    return getattr(transformers, model_name)._from_config(copy.deepcopy(config), attn_implementation=implementation)


def call(model, n: int, mode: str):
    ids = torch.randint(0, SHAPE["vocab_size"], (1, n), generator=torch.Generator().manual_seed(1))
    if mode == "fwd":
        model.eval()

        def run():
            with torch.no_grad():
                return model(input_ids=ids, use_cache=False).logits
    else:
        model.train()

        def run():
            model.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    return run


def worker(spec: dict) -> dict:
    from attnkit.bench.harness import peak_extra_mb

    model = build(spec["family"], spec["impl"])
    run = call(model, spec["n"], spec["mode"])
    if spec.get("record"):
        import attnkit.hf

        plain = run

        def run():
            with attnkit.hf.record(model, layers=[0], heads=[0]) as recording:
                plain()
            return recording
    run()  # warm-up
    return {"peak_extra_mb": peak_extra_mb(run)}


def record_memory(n: int) -> dict:
    """Peak extra memory of a forward pass at n tokens with and without capturing one head of one
    layer, each in a fresh process; the claim: the difference is at most one head's (n, n) float32
    weights plus 20%."""
    from attnkit.bench.harness import run_worker

    here = str(Path(__file__).resolve())
    spec = {"family": "llama", "n": n, "mode": "fwd", "impl": "attnkit"}
    plain = run_worker(here, spec, timeout=1800)["peak_extra_mb"]
    recorded = run_worker(here, spec | {"record": True}, timeout=1800)["peak_extra_mb"]
    one_head = n * n * 4 / 2**20
    return {"n": n, "plain_mb": plain, "record_one_head_mb": recorded, "difference_mb": recorded - plain,
            "one_head_weights_mb": one_head, "ratio": (recorded - plain) / one_head}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--modes", nargs="+", default=["fwd", "fwd+bwd"], choices=["fwd", "fwd+bwd"])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--max-eager-gb", type=float, default=2.0)
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "hf.json")
    parser.add_argument("--record", type=int, metavar="N", help="only measure record()'s memory at N tokens")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        from attnkit.bench.harness import serve_worker

        return serve_worker(args.worker, worker)
    if args.record:
        from attnkit._files import write_json

        result = record_memory(args.record)
        print(f"n={result['n']}: forward +{result['plain_mb']:.0f} MB, with one head recorded "
              f"+{result['record_one_head_mb']:.0f} MB; difference {result['difference_mb']:.0f} MB = "
              f"{result['ratio']:.2f} x one head's weights ({result['one_head_weights_mb']:.0f} MB)")
        write_json(args.out.with_name("hf_record.json"), result)
        return 0
    from attnkit._files import write_json
    from attnkit.bench.harness import machine_info, run_worker, time_round_robin

    rows = []
    for family in args.families:
        for n in args.sizes:
            for mode in args.modes:
                impls = ["attnkit", "sdpa"]
                eager_gb = SHAPE["num_attention_heads"] * n * n * 4 * (3 if mode == "fwd+bwd" else 1) / 2**30
                if eager_gb <= args.max_eager_gb:
                    impls.append("eager")
                calls = {impl: call(build(family, impl), n, mode) for impl in impls}
                times = time_round_robin(calls, repeats=3, min_seconds=2.0, warmup_seconds=0.1)
                for impl in impls:
                    row = {"family": family, "n": n, "mode": mode, "impl": impl, "time_s": times[impl]["time_s"],
                           "speedup_vs_sdpa": times["sdpa"]["time_s"] / times[impl]["time_s"]}
                    if not args.no_memory:
                        spec = {"family": family, "n": n, "mode": mode, "impl": impl}
                        row |= run_worker(str(Path(__file__).resolve()), spec, timeout=1800)
                    rows.append(row)
                    print(f"{family:8s} n={n:6d} {mode:8s} {impl:8s} {row['time_s'] * 1e3:9.1f} ms  "
                          f"{row['speedup_vs_sdpa']:5.2f}x sdpa" + (f"  peak +{row['peak_extra_mb']:.0f} MB"
                                                                  if "peak_extra_mb" in row else ""), flush=True)
                write_json(args.out, {"benchmark": "hf", "shape": SHAPE, "machine": machine_info(), "results": rows})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
