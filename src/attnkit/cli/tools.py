"""Seeing and measuring attention: ``tour`` and ``bench`` (``inspect`` is in inspection.py); ``build-ext``, a
retired command that says it is gone."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .arguments import (
    UsageError,
    add_device_argument,
    check_device,
    float_in,
    input_file,
    int_in,
    output_dir,
    owned_folder,
    refuse_unused,
    seed,
)

__all__ = ["add_tour_parser", "add_bench_parser", "add_build_ext_parser"]


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
    tour.add_argument("--seed", type=seed, default=0, help="seed of the word vectors")
    tour.set_defaults(run=_tour)


def _build_ext(args: argparse.Namespace) -> int:
    print("attnkit build-ext is gone: attnkit compiles nothing, and attention() needs no compiled piece "
          "(docs/performance.md); remove this step", file=sys.stderr)
    return 0


def add_build_ext_parser(commands) -> None:
    """The retired ``build-ext`` sub-command: kept one release so that set-up scripts that run it say why it is
    gone instead of failing; it takes its old flags and does nothing. ``attnkit --help`` does not list it."""
    build = commands.add_parser("build-ext", description="gone: attnkit compiles nothing (says so, and does nothing)")
    for flag in ("--verbose", "--quiet", "--status"):
        build.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    build.set_defaults(run=_build_ext)


def _bench(args: argparse.Namespace) -> int:
    from .. import bench
    from .._files import read_json

    if args.render:
        refuse_unused(args, ["sizes", "masks", "impls", "dtypes", "window", "repeats", "min_seconds", "max_call_seconds",
                             "max_memory_gb", "no_memory", "context_parallel", "worlds"],
                      "measures; --render prints a recorded JSON and measures nothing")
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
