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

``--server``: a load run of ``attnkit serve`` instead, on 127.0.0.1 only, bounded in clients and time: SmolLM2-135M
served in this process, ``--clients`` threads of the official ``openai`` client streaming completions (a prompt
from a fixed list, 32-128 new tokens) for ``--seconds``, then the requests finished per second, time to first token
and each request's tokens/s (p50, p99), the errors, and the blocks still held (none but the prefix cache's).

Usage:
    python benchmarks/serving.py                         # both models, every load, transformers too
    python benchmarks/serving.py --models llama --no-transformers --requests 16
    python benchmarks/serving.py --server                # 64 clients for 60 s (benchmarks/results/serving_server.json)
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


PROMPTS = ["Write a short story about a lighthouse keeper.", "What is the capital of France?",
           "Explain attention in one paragraph.", "List three uses of a paperclip.", "Describe the sea at night.",
           "Translate 'good morning' into Spanish.", "Why is the sky blue?", "Give me a haiku about autumn."]


def _server_load(clients: int, seconds: float, threads: int, out: Path) -> int:
    """The load run of ``--server`` (module docstring)."""
    import statistics
    import threading

    from openai import OpenAI

    from attnkit.models.chat import chat_format_of_gguf
    from attnkit.models.pretrained import load_gguf, smollm2_gguf
    from attnkit.serving.server import EngineLoop, ServedModel, serve

    model, tokenizer, _ = load_gguf(smollm2_gguf())
    chat = chat_format_of_gguf(smollm2_gguf())
    served = ServedModel(EngineLoop(Engine(model)), "smollm2", tokenizer, chat, tuple(chat.eos_ids), model.config.max_len)
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ready = threading.Event()
    server = threading.Thread(target=serve, args=(served,), kwargs=dict(host="127.0.0.1", port=port, on_ready=ready.set),
                              daemon=True)
    server.start()
    assert ready.wait(120), "the server did not start"
    done: list[dict] = []
    errors: list[str] = []
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def client(number: int) -> None:
        api = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
        turn = 0
        while time.perf_counter() < deadline:
            messages = [{"role": "user", "content": PROMPTS[(number + turn) % len(PROMPTS)]}]
            new = 32 + (number * 7 + turn * 13) % 97
            start, first, count = time.perf_counter(), None, 0
            try:
                for chunk in api.chat.completions.create(model="smollm2", messages=messages, max_tokens=new,
                                                         temperature=0, stream=True,
                                                         stream_options={"include_usage": True}):
                    if chunk.choices and chunk.choices[0].delta.content and first is None:
                        first = time.perf_counter()
                    if chunk.usage is not None:
                        count = chunk.usage.completion_tokens
            except Exception as error:  # counted, reported
                with lock:
                    errors.append(f"{type(error).__name__}: {error}")
                return
            end = time.perf_counter()
            with lock:
                done.append({"ttft": (first or end) - start, "tokens": count, "seconds": end - start, "end": end})
            turn += 1

    torch.set_num_threads(threads)
    workers = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    stats = served.loop.stats
    served.draining.set()
    server.join(timeout=60)

    def pct(values: list[float], q: float) -> float:
        return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else (values[0] if values else float("nan"))

    ttft = [d["ttft"] for d in done]
    rates = [d["tokens"] / max(d["seconds"] - d["ttft"], 1e-9) for d in done if d["tokens"] > 1]
    result = {"machine": machine_info(), "threads": threads, "clients": clients, "seconds": seconds,
              "elapsed": elapsed, "requests": len(done), "requests_per_second": len(done) / elapsed,
              "tokens": sum(d["tokens"] for d in done), "tokens_per_second": sum(d["tokens"] for d in done) / elapsed,
              "ttft_p50": pct(ttft, 50), "ttft_p99": pct(ttft, 99), "request_tokens_per_second_p50": pct(rates, 50),
              "request_tokens_per_second_p99": pct(rates, 1), "errors": errors,
              "blocks_in_use_after": stats["blocks_in_use"], "running_after": stats["running"],
              "prefix_hit_tokens": stats["prefix_hit_tokens"], "preemptions": stats["preemptions"]}
    print(f"{clients} clients for {seconds:.0f} s (SmolLM2-135M, {threads} threads): {len(done)} requests "
          f"({result['requests_per_second']:.2f}/s), {result['tokens']:,} tokens ({result['tokens_per_second']:.1f}/s); "
          f"time to first token p50 {result['ttft_p50']:.2f} s, p99 {result['ttft_p99']:.2f} s; a request's tokens/s "
          f"p50 {result['request_tokens_per_second_p50']:.1f}, slowest 1% {result['request_tokens_per_second_p99']:.1f}; "
          f"errors {len(errors)}; blocks in use after {stats['blocks_in_use']}, prefix hits "
          f"{stats['prefix_hit_tokens']:,} tokens")
    write_json(out, result)
    print(f"wrote {out}")
    return 0 if not errors and stats["blocks_in_use"] == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["llama", "qwen3-next"], choices=["llama", "qwen3-next"])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="alternated runs of each side; the median is kept")
    parser.add_argument("--no-transformers", action="store_true", help="leave out transformers' generate_batch")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/serving.json"))
    parser.add_argument("--server", action="store_true", help="the load run of attnkit serve instead (docstring)")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args(argv)
    if args.server:
        out = args.out if args.out != Path("benchmarks/results/serving.json") else Path(
            "benchmarks/results/serving_server.json")
        return _server_load(args.clients, args.seconds, args.threads, out)
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
