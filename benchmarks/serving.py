"""Serving many requests: the engine (continuous batching over paged caches) against attnkit's static ``generate``
and transformers' continuous batching, on a Llama-shaped and a Qwen3-Next-shaped tiny model (random weights saved
by transformers and loaded by attnkit's own loader, so both libraries run the same weights), CPU, greedy.

- **uniform**: 64 requests, prompts of 32-256 tokens, 64 new tokens each, all there at the start: the engine's
  tokens/s against ``generate`` on the same requests as one left-padded batch (target >= 0.9x) and, on the Llama,
  transformers' ``generate_batch`` (its continuous batching; target engine >= 5x);
- **mixed**: 64 requests of 8-256 new tokens arriving 4 a step: the engine against ``generate`` run batch after batch
  of 16 in arrival order, each batch until its longest request is done (target >= 2x); tokens/s counts the tokens
  asked for;
- **memory**: the engine's largest KV bytes held at any step against the bytes of the tokens its live requests held
  then plus one block each (target <= 1.1x), beside the padded KV a static batch holds at least (its longest prompt
  plus the new tokens, every row).

The engine's tokens are asserted equal to ``generate``'s first (each request alone would give them too:
tests/external/test_serving_families.py).

Usage:
    python benchmarks/serving.py                         # both models, every load, transformers too
    python benchmarks/serving.py --models llama --no-transformers --requests 16
Prints a table and writes JSON (default benchmarks/results/serving.json).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch

from attnkit._files import write_json
from attnkit.bench import machine_info
from attnkit.decoding import generate, pad_prompts
from attnkit.models.pretrained import load_hf_folder
from attnkit.serving import Engine

VOCAB = 512


def _models(names: list[str], folder: Path) -> dict:
    """(transformers' model, attnkit's loaded from the folder transformers saved) per shape."""
    import transformers

    shapes = {
        "llama": transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                                          num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=4096),
        "qwen3-next": transformers.Qwen3NextConfig(
            vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=4, head_dim=32, linear_num_key_heads=4, linear_num_value_heads=8,
            linear_key_head_dim=32, linear_value_head_dim=32, num_experts=0, max_position_embeddings=4096,
            layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"]),
    }
    models = {}
    for name in names:
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = transformers.AutoModelForCausalLM.from_config(shapes[name], attn_implementation="sdpa").eval()
        theirs.save_pretrained(folder / name)
        models[name] = (theirs, load_hf_folder(folder / name))
    return models


def _engine_run(model, prompts, new_tokens, per_step: int | None = None) -> tuple[float, list[list[int]], dict]:
    """Seconds, tokens, and the memory figures of one engine run (``per_step``: requests arriving that many a step)."""
    engine = Engine(model)
    queue, ids = list(zip(prompts, new_tokens)), []
    peak = {"bytes_held": 0, "bytes_needed": 0}
    start = time.perf_counter()
    while queue or engine.has_unfinished():
        for _ in range(len(queue) if per_step is None else per_step):
            if queue:
                prompt, new = queue.pop(0)
                ids.append(engine.add_request(prompt, max_new_tokens=new))
        engine.step()
        stats = engine.stats()
        if stats["bytes_held"] > peak["bytes_held"]:
            live = engine.scheduler.running
            per_block = stats["bytes_per_block"]
            tokens = sum(r.computed for r in live)
            peak = {"bytes_held": stats["bytes_held"], "bytes_needed":
                    tokens * per_block // engine.block_size + len(live) * per_block, "live": len(live),
                    "tokens_held": tokens, "bytes_per_token": per_block // engine.block_size}
    seconds = time.perf_counter() - start
    return seconds, [engine.tokens(i) for i in ids], peak


def _static(model, prompts, new_tokens, batch: int) -> tuple[float, list[list[int]]]:
    """``generate`` batch after batch of ``batch`` prompts in order, each batch until its longest request is done."""
    start, out = time.perf_counter(), []
    for first in range(0, len(prompts), batch):
        group, news = prompts[first:first + batch], new_tokens[first:first + batch]
        ids, mask = pad_prompts(group)
        result = generate(model, ids, attention_mask=mask, max_new_tokens=max(news))
        out.extend(row[:new] for row, new in zip(result.tokens.tolist(), news))
    return time.perf_counter() - start, out


def _alternated(baseline, engine, repeats: int):
    """The baseline and the engine run alternately ``repeats`` times each (a machine that slows down for a while
    slows both): their median seconds, and the tokens and memory figures of their last runs."""
    base_times, engine_times = [], []
    for _ in range(repeats):
        seconds, base_tokens = baseline()
        base_times.append(seconds)
        seconds, engine_tokens, peak = engine()
        engine_times.append(seconds)
    return statistics.median(base_times), base_tokens, statistics.median(engine_times), engine_tokens, peak


def _transformers_batch(model, prompts, new: int) -> float:
    import transformers

    config = transformers.GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=VOCAB + 1, pad_token_id=0)
    start = time.perf_counter()
    with torch.no_grad():
        model.generate_batch(inputs=prompts, generation_config=config, progress_bar=False)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["llama", "qwen3-next"], choices=["llama", "qwen3-next"])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="alternated runs of each side; the median is kept")
    parser.add_argument("--no-transformers", action="store_true", help="leave out transformers' generate_batch")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/serving.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(32, 257, (args.requests,), generator=g).tolist()
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]
    uniform = [64] * args.requests
    mixed = torch.randint(8, 257, (args.requests,), generator=g).tolist()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, (theirs, ours) in _models(args.models, Path(folder)).items():
            with torch.no_grad():
                static_s, static_tokens, engine_s, engine_tokens, peak = _alternated(
                    lambda: _static(ours, prompts, uniform, batch=args.requests),
                    lambda: _engine_run(ours, prompts, uniform), args.repeats)
                assert engine_tokens == static_tokens, f"{name}: the engine's tokens are not generate's"
                row = {"model": name, "load": "uniform", "requests": args.requests, "tokens": sum(uniform),
                       "engine_s": engine_s, "baseline": "generate, one padded batch", "baseline_s": static_s,
                       "ratio": static_s / engine_s, "target": 0.9,
                       "peak_kv_bytes": peak["bytes_held"], "tokens_held_plus_a_block_each_bytes": peak["bytes_needed"],
                       "memory_ratio": peak["bytes_held"] / max(1, peak["bytes_needed"]), "memory_target": 1.1,
                       "static_padded_kv_bytes_at_least": args.requests * (max(lengths) + 64) * peak["bytes_per_token"]}
                rows.append(row)
                if name == "llama" and not args.no_transformers:
                    hf_s = _transformers_batch(theirs, prompts, 64)
                    rows.append({"model": name, "load": "uniform", "requests": args.requests, "tokens": sum(uniform),
                                 "engine_s": engine_s, "baseline": "transformers generate_batch", "baseline_s": hf_s,
                                 "ratio": hf_s / engine_s, "target": 5.0})
                static_s, static_tokens, engine_s, engine_tokens, _ = _alternated(
                    lambda: _static(ours, prompts, mixed, batch=16),
                    lambda: _engine_run(ours, prompts, mixed, per_step=4), args.repeats)
                assert engine_tokens == static_tokens, f"{name}: the engine's tokens are not generate's (mixed)"
                rows.append({"model": name, "load": "mixed, 4 a step", "requests": args.requests, "tokens": sum(mixed),
                             "engine_s": engine_s, "baseline": "generate, batches of 16 in arrival order",
                             "baseline_s": static_s, "ratio": static_s / engine_s, "target": 2.0})
    print(f"{'model':<11} {'load':<16} {'baseline':<40} {'engine tok/s':>12} {'baseline tok/s':>14} {'ratio':>6} "
          f"{'target':>6}")
    for row in rows:
        met = "met" if row["ratio"] >= row["target"] else "missed"
        print(f"{row['model']:<11} {row['load']:<16} {row['baseline']:<40} {row['tokens'] / row['engine_s']:>12,.0f} "
              f"{row['tokens'] / row['baseline_s']:>14,.0f} {row['ratio']:>5.2f}x {row['target']:>5.1f}x {met}")
    for row in rows:
        if "memory_ratio" in row:
            print(f"{row['model']}: peak KV {row['peak_kv_bytes'] / 2**20:.1f} MiB held against "
                  f"{row['tokens_held_plus_a_block_each_bytes'] / 2**20:.1f} MiB for the tokens held plus a block "
                  f"each: {row['memory_ratio']:.3f}x (target <= 1.1x); a static padded batch holds at least "
                  f"{row['static_padded_kv_bytes_at_least'] / 2**20:.1f} MiB")
    write_json(args.out, {"machine": machine_info(), "threads": args.threads, "repeats": args.repeats, "rows": rows})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
