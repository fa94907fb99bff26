"""Batched greedy generation against transformers' ``generate`` on the same weights:
``--batches`` prompts of different lengths (default 8) as one left-padded batch, ``--new-tokens`` each,
no stop token.

Rows, each timed in this one process (median of ``--repeats`` after a warm-up that includes any
compile), tokens per second = 8 x new tokens / seconds:

- transformers ``generate``, its default (dynamic) cache, attention ``"sdpa"`` (its default);
- the same with ``attn_implementation="eager"`` (row ``hf-eager``);
- transformers ``generate`` with ``cache_implementation="static"``, transformers' own recipe for
  fast decoding: on CUDA it compiles the forward itself (CUDA graphs); elsewhere the benchmark
  compiles it (``--backend``);
- attnkit ``generate`` with its growing KV cache;
- attnkit ``generate(compile_step=True)``: fixed-size caches and the decode step compiled (CUDA
  graphs on CUDA).

The model is Llama-shaped (default 1024 wide, 12 layers, 16 heads, 4 KV heads, vocabulary 32,000;
random weights copied into attnkit with ``load_hf_state_dict``). In float32 every row's tokens must
equal transformers' default row (checked, recorded); ``--dtype bfloat16`` records the speed only
(bf16 rounding lets greedy paths part). Writes JSON (default benchmarks/results/gpu/generation.json,
atomically) with the device and versions, and prints a markdown table with ratios to transformers'
default row.

    python benchmarks/gpu_generation.py                       # CUDA, fp32 then bf16
    python benchmarks/gpu_generation.py --dtypes bfloat16 --batches 1 16 --rows hf-eager attnkit hf-static attnkit-compiled
    python benchmarks/gpu_generation.py --device cpu --tiny --backend aot_eager   # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch


def _llama(tiny: bool):
    import transformers

    if tiny:
        shape = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=128, vocab_size=512)
    else:
        shape = dict(hidden_size=1024, num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=4,
                     intermediate_size=2816, vocab_size=32000)
    config = transformers.LlamaConfig(max_position_embeddings=2048, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                      **shape)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def _time(run, repeats: int, device: str) -> tuple[float, torch.Tensor]:
    tokens = run()  # warm-up (and compile)
    seconds = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        tokens = run()
        if device == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), tokens.cpu()


def rows_for(dtype: torch.dtype, args, rows: list[dict] | None = None, save=lambda: None, batch: int = 8,
             kinds: list[str] | None = None, baseline: bool = True, references: dict | None = None) -> list[dict]:
    """Rows of ``kinds`` (default ``args.rows``) at one dtype and batch size, after transformers' default
    ``generate`` when ``baseline`` (the tokens the others are checked against)."""
    from attnkit.decoding import generate, pad_prompts
    from attnkit.models.decoder import DecoderLM
    from attnkit.models.pretrained import config_from_hf, load_hf_state_dict

    hf = _llama(args.tiny)
    ours = DecoderLM(config_from_hf(hf.config.to_dict())).eval()
    load_hf_state_dict(ours, hf.state_dict(), "llama")
    hf, ours = hf.to(args.device, dtype), ours.to(args.device, dtype)
    generator = torch.Generator().manual_seed(1)
    vocab = hf.config.vocab_size
    lengths = (5, 9, 17, 24, 31, 40, 48, 64)
    prompts = [torch.randint(3, vocab, (lengths[i % 8],), generator=generator).tolist() for i in range(batch)]
    ids, mask = pad_prompts(prompts)
    ids, mask = ids.to(args.device), mask.to(args.device)
    new = args.new_tokens

    def theirs() -> torch.Tensor:
        with torch.no_grad():
            return hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                               do_sample=False, pad_token_id=0)[:, ids.shape[1]:]

    def theirs_eager() -> torch.Tensor:
        hf.config._attn_implementation = "eager"
        try:
            return theirs()
        finally:
            hf.config._attn_implementation = implementation

    implementation = hf.config._attn_implementation

    def theirs_static() -> torch.Tensor:
        with torch.no_grad():
            return hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                               do_sample=False, pad_token_id=0, cache_implementation="static")[:, ids.shape[1]:]

    def ours_plain() -> torch.Tensor:
        return generate(ours, ids, attention_mask=mask, max_new_tokens=new).tokens

    def ours_compiled() -> torch.Tensor:
        return generate(ours, ids, attention_mask=mask, max_new_tokens=new,
                        compile_step=args.backend if args.backend else True).tokens

    rows = [] if rows is None else rows
    references = {} if references is None else references  # (dtype, batch) -> the baseline's tokens
    reference = references.get((dtype, batch))
    plain_forward = hf.forward
    candidates = {"hf-eager": ("transformers generate, eager attention", theirs_eager),
                  "hf-static": ("transformers generate, static cache + compile", theirs_static),
                  "attnkit": ("attnkit generate", ours_plain), "attnkit-compiled": ("attnkit generate, compile_step", ours_compiled)}
    chosen = [("transformers generate", theirs)] if baseline else []
    chosen += [candidates[key] for key in (args.rows if kinds is None else kinds)]
    for name, run in chosen:
        # On CUDA transformers compiles the forward itself for a static cache (its auto-compile);
        # wrapping it again in CUDA graphs broke that row on an H100 ("accessing tensor output of
        # CUDAGraphs that has been overwritten"). Elsewhere it compiles nothing, so we do.
        if "static cache" in name and args.device != "cuda":
            hf.forward = torch.compile(plain_forward, fullgraph=True, **({"backend": args.backend} if args.backend else {}))
        try:
            seconds, tokens = _time(run, args.repeats, args.device)
            error = None
        except Exception as exc:  # a row that cannot run here is recorded with its reason, not hidden
            seconds, tokens, error = float("nan"), None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        finally:
            hf.forward = plain_forward
        if name == "transformers generate":
            reference = references[(dtype, batch)] = tokens
        same = None if tokens is None or reference is None else bool(torch.equal(tokens, reference))
        rows.append({"dtype": str(dtype).removeprefix("torch."), "batch": batch, "row": name, "seconds": seconds,
                     "tokens_per_s": len(prompts) * new / seconds, "same_tokens_as_transformers": same, "error": error})
        print(f"  {rows[-1]['dtype']:>8}  batch {batch:>3}  {name:<48} {rows[-1]['tokens_per_s']:>10,.0f} tok/s  same tokens: {same}"
              + (f"  ({error})" if error else ""), flush=True)
        save()  # a run cut short keeps its finished rows
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="a 2-layer, 64-wide model (a smoke run)")
    parser.add_argument("--backend", help="torch.compile backend for the compiled rows (default: inductor)")
    parser.add_argument("--batches", type=int, nargs="+", default=[8], help="prompts a batch, one batch size a pass")
    parser.add_argument("--rows", nargs="+", default=["hf-static", "attnkit", "attnkit-compiled"],
                        choices=["hf-eager", "hf-static", "attnkit", "attnkit-compiled"],
                        help="rows beside transformers' default generate, which always runs (the baseline and the "
                             "tokens every row is checked against); a compiled row alone fits a shorter GPU call")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu" / "generation.json")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: this machine has no CUDA device (use --device cpu --tiny for a smoke run)")

    import transformers

    from attnkit._files import write_json
    from attnkit._markdown import markdown_table
    from attnkit.bench.harness import machine_info

    rows: list[dict] = []
    report = {"benchmark": "gpu_generation", "config": vars(args) | {"out": str(args.out)},
              "machine": machine_info(args.device), "transformers": transformers.__version__, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        for row in rows:
            base = next(r for r in rows if r["dtype"] == row["dtype"] and r["batch"] == row["batch"]
                        and r["row"] == "transformers generate")
            row["ratio_to_transformers"] = row["tokens_per_s"] / base["tokens_per_s"]
        write_json(args.out, report)

    # Every batch's uncompiled rows first, then the compiled ones (their compiles take the time): a run cut
    # short keeps the most rows.
    compiled = [key for key in args.rows if key in ("hf-static", "attnkit-compiled")]
    groups = [[key for key in args.rows if key not in compiled], compiled]
    references: dict = {}
    for dtype in args.dtypes:
        for number, kinds in enumerate(groups):
            for batch in args.batches:
                if kinds or number == 0:
                    rows_for(getattr(torch, dtype), args, rows, save, batch=batch, kinds=kinds, baseline=number == 0,
                             references=references)
    print("\n".join(markdown_table(["dtype", "batch", "row", "tokens/s", "vs transformers generate", "same tokens"],
                                   [[r["dtype"], r["batch"], r["row"], f"{r['tokens_per_s']:,.0f}",
                                     f"{r['ratio_to_transformers']:.2f}x",
                                     r["same_tokens_as_transformers"]] for r in rows])))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
