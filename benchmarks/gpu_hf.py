"""Training steps through the Hugging Face bridge on a GPU: the same weights in
transformers with its own attention implementations, with ``attn_implementation="attnkit"``, and,
for Llama, converted into attnkit's native ``DecoderLM``.

A step is the forward and backward of the next-token loss (bf16 weights, no optimizer: it is the
same for every row). Rows are timed in this one process with CUDA events (median of ``--repeats``
steps after two warm-up steps that include any compile); tokens per second = batch x length /
seconds. Rows that cannot run (out of memory, a missing kernel) are recorded with the reason.

- **Llama** (1024 wide, 12 layers, 16 heads, 4 KV heads, vocabulary 32,000): 8 x 2K and 1 x 8K
  tokens; transformers ``"sdpa"`` against the bridge and native attnkit.
- **Mistral** (512 wide, 4 layers, 8 heads, 2 KV heads, sliding window 4096): 1 x 16K and 1 x 32K;
  transformers ``"flex_attention"`` and ``"sdpa"`` against the bridge.

Writes ``--out`` (default benchmarks/results/gpu/hf.json, atomically, after every row) and prints
a markdown table with each row's ratio to its baseline (>1: faster than the baseline).

    python benchmarks/gpu_hf.py
    python benchmarks/gpu_hf.py --workloads mistral-32k
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

LLAMA = dict(hidden_size=1024, num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=4,
             intermediate_size=2816, vocab_size=32000, max_position_embeddings=8192)
MISTRAL = dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
               intermediate_size=1536, vocab_size=32000, max_position_embeddings=32768, sliding_window=4096)
# name: (family, batch, length, baseline, rows)
WORKLOADS = {
    "llama-8x2k": ("llama", 8, 2048, "sdpa", ["sdpa", "attnkit", "native"]),
    "llama-1x8k": ("llama", 1, 8192, "sdpa", ["sdpa", "attnkit", "native"]),
    "mistral-16k": ("mistral", 1, 16384, "flex_attention", ["flex_attention", "sdpa", "attnkit"]),
    "mistral-32k": ("mistral", 1, 32768, "flex_attention", ["flex_attention", "sdpa", "attnkit"]),
}


def _hf_model(family: str, implementation: str):
    import transformers

    config_class, model_class, shape = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, LLAMA),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, MISTRAL),
    }[family]
    torch.manual_seed(0)  # the same weights for every row of a family
    return model_class._from_config(config_class(**shape), attn_implementation=implementation)


def _native(hf_model):
    from attnkit.models.decoder import DecoderLM
    from attnkit.models.pretrained import config_from_hf, load_hf_state_dict

    ours = DecoderLM(config_from_hf(hf_model.config.to_dict()))
    load_hf_state_dict(ours, hf_model.state_dict(), "llama")
    return ours


def _step(model, ids: torch.Tensor, native: bool) -> None:
    logits = model(ids).logits if native else model(input_ids=ids).logits
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
    loss.backward()
    model.zero_grad(set_to_none=True)


def workload_rows(name: str, repeats: int) -> list[dict]:
    import attnkit.hf
    from attnkit.bench.harness import cuda_median_ms

    attnkit.hf.register()
    family, batch, length, baseline, implementations = WORKLOADS[name]
    ids = torch.randint(3, 32000, (batch, length), generator=torch.Generator().manual_seed(1)).cuda()
    rows = []
    for implementation in implementations:
        row = {"workload": name, "family": family, "batch": batch, "length": length, "row": implementation}
        model = None
        try:
            if implementation == "native":
                model = _native(_hf_model(family, "eager")).cuda().to(torch.bfloat16).train()
            else:
                model = _hf_model(family, implementation).cuda().to(torch.bfloat16).train()
            torch.cuda.reset_peak_memory_stats()
            row["seconds"] = cuda_median_ms(lambda: _step(model, ids, implementation == "native"), repeats) / 1000
            row["tokens_per_s"] = batch * length / row["seconds"]
            row["peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
        except Exception as error:  # recorded with its reason, never hidden
            row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
        finally:
            model = None
            torch.cuda.empty_cache()
        rows.append(row)
        print(f"  {name:<12} {implementation:<15} " + (f"{row['seconds']:.4f} s  {row['tokens_per_s']:>10,.0f} tok/s"
                                                          if "seconds" in row else row["error"]), flush=True)
    base = next((r for r in rows if r["row"] == baseline and "seconds" in r), None)
    for row in rows:
        if base is not None and "seconds" in row:
            row[f"ratio_to_{baseline}"] = base["seconds"] / row["seconds"]
    return rows


def markdown(rows: list[dict]) -> str:
    from attnkit._markdown import markdown_table

    table = []
    for r in rows:
        ratio = next((f"{v:.2f}x vs {k.removeprefix('ratio_to_')}" for k, v in r.items() if k.startswith("ratio_to_")), "-")
        table.append([r["workload"], r["row"], f"{r['seconds']:.4f}" if "seconds" in r else r.get("error", "-"),
                      f"{r['tokens_per_s']:,.0f}" if "tokens_per_s" in r else "-",
                      f"{r['peak_gb']:.1f}" if "peak_gb" in r else "-", ratio])
    return "\n".join(markdown_table(["workload", "attention", "s / step", "tokens/s", "peak GB", "ratio"], table))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--nan-rule", choices=["on", "off"], default="off",
                        help="on: attnkit's rows run inside attnkit.nan_rule(True) (what the rule costs; off is "
                             "attnkit's default)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu" / "hf.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("benchmarks/gpu_hf.py needs a CUDA GPU")
    import transformers

    from attnkit._files import write_json
    from attnkit.bench.harness import machine_info

    torch._dynamo.config.recompile_limit = 512  # flex_attention compiles per length and pattern
    report = {"benchmark": "gpu_hf", "config": vars(args) | {"out": str(args.out)}, "machine": machine_info("cuda"),
              "transformers": transformers.__version__, "llama": LLAMA, "mistral": MISTRAL, "rows": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    import attnkit

    with attnkit.nan_rule(args.nan_rule == "on"):
        for name in args.workloads:
            report["rows"] += workload_rows(name, args.repeats)
            write_json(args.out, report)
    print(markdown(report["rows"]))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
