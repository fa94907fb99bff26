"""The core on a GPU: attnkit against PyTorch's fused kernels on the same inputs.

Every row is timed in this one process with CUDA events, bf16, B = 1, H = 16, E = 128 unless
``--batch`` / ``--heads`` / ``--head-dim`` say otherwise, two ways: single-call latency (median of
``--repeats`` calls, each between its own events, after a warm-up that includes any compile) and
back-to-back throughput (``--repeats`` calls issued between two events, per call: what a model sees,
the host's per-call work overlapping earlier kernels), torch and attnkit alternating for ``--rounds``
rounds (default 3), each figure the median over rounds:

- dense and causal: ``F.scaled_dot_product_attention`` against ``attnkit.attention`` (auto);
- causal window 1024 and Longformer (two-sided window 512 + 16 global tokens): compiled
  ``flex_attention`` with torch's own ``create_block_mask(..., _compile=True)`` against attnkit auto
  with its closed-form block mask (window: the ``window=`` argument);
- block-mask construction at 64K and 1M tokens: torch's compiled ``create_block_mask`` against
  attnkit's closed-form builder (its int8 tile table), and the builder plus the conversion to
  FlexAttention's four int32 tables (dense grids in torch's format), seconds and peak MB.

Writes ``--out`` (default benchmarks/results/gpu/core.json, atomically) with the device, torch and
CUDA versions, and prints a markdown table with the ratios (>1: attnkit faster).

    python benchmarks/gpu.py                  # 4K, 16K, 64K, 128K (an H100: a few minutes)
    python benchmarks/gpu.py --sizes 4096     # one size
    python benchmarks/gpu.py --sizes 4096 16384 --patterns dense causal --mask-sizes --nan-rule on
    python benchmarks/gpu.py --sizes 4096 --batch 8 --heads 32 --patterns dense causal --mask-sizes
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

import attnkit
from attnkit._files import write_json
from attnkit.bench.harness import cuda_back_to_back_ms, cuda_median_ms, finish_gpu_report, gpu_report, peak_extra_mb
from attnkit.functional.backends import flex, flex_tables
from attnkit.functional.block_patterns import longformer_block_mask

attention_module = importlib.import_module("attnkit.functional.attention")  # the module, not the function

WINDOW, LONGFORMER_WINDOW, GLOBALS = 1024, 512, 16
B, H, E = 1, 16, 128


def _torch_mods(n: int):
    flags = torch.zeros(n, dtype=torch.bool, device="cuda")
    flags[:GLOBALS] = True
    radius = LONGFORMER_WINDOW // 2
    return {
        "window": lambda b, h, i, j: (j <= i) & (i - j < WINDOW),
        "longformer": lambda b, h, i, j: ((i - j).abs() <= radius) | flags[i] | flags[j],
    }, flags


PATTERNS = ("dense", "causal", "window", "longformer")
MODES = ("fwd", "fwd+bwd")


def _cases(n: int, patterns=PATTERNS):
    """(name, torch call, attnkit keyword arguments) per pattern at length n, each built when it is reached
    (a generator: the dense and causal rows are timed and saved before any block mask compiles)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if "dense" in patterns:
        yield ("dense", lambda q, k, v: F.scaled_dot_product_attention(q, k, v), {})
    if "causal" in patterns:
        yield ("causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), {"is_causal": True})
    compiled = torch.compile(flex_attention, dynamic=False)
    mods, flags = _torch_mods(n)
    if "window" in patterns:
        window_blocks = create_block_mask(mods["window"], None, None, n, n, device="cuda", _compile=True)
        yield (f"causal window {WINDOW}", lambda q, k, v: compiled(q, k, v, block_mask=window_blocks),
               {"window": WINDOW})
    if "longformer" in patterns:
        longformer_blocks = create_block_mask(mods["longformer"], None, None, n, n, device="cuda", _compile=True)
        yield (f"Longformer {LONGFORMER_WINDOW} + {GLOBALS} globals",
               lambda q, k, v: compiled(q, k, v, block_mask=longformer_blocks),
               {"mask": longformer_block_mask(LONGFORMER_WINDOW, flags)})


def _chosen(q, k, v, kwargs) -> str:
    """The backend ``auto`` runs for this call: what it chooses, or "sdpa" where a plain call (no mask, window
    or score_mod) goes straight to SDPA without choosing."""
    chosen = []
    real, plain = attention_module.choose_backend, attention_module._plain
    attention_module.choose_backend = lambda problem: chosen.append(real(problem)) or chosen[-1]
    attention_module._plain = lambda *args: chosen.append("sdpa (plain call)") or plain(*args)
    try:
        with torch.no_grad():
            attnkit.attention(q, k, v, **kwargs)
    finally:
        attention_module.choose_backend, attention_module._plain = real, plain
    return chosen[0]


def attention_rows(sizes, repeats: int, progress, save=lambda: None, rows=None, patterns=PATTERNS,
                   shape=(B, H, E), long_repeats: int | None = None, modes=MODES, rounds: int = 1) -> list[dict]:
    rows = [] if rows is None else rows
    batch, heads, head_dim = shape
    for n in sizes:
        repeats_here = repeats if n <= 16384 or long_repeats is None else long_repeats
        torch.manual_seed(0)
        q, k, v = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        d_out = torch.randn_like(q)
        for name, theirs, kwargs in _cases(n, patterns):
            ours = lambda q, k, v, kw=kwargs: attnkit.attention(q, k, v, **kw).output  # noqa: E731
            row = {"n": n, "pattern": name, "attnkit_backend": _chosen(q, k, v, kwargs)}
            for mode in modes:
                runs = {}
                for label, call in (("torch", theirs), ("attnkit", ours)):
                    if mode == "fwd":
                        def run(call=call):
                            with torch.no_grad():
                                call(q, k, v)
                    else:
                        def run(call=call):
                            call(q, k, v).backward(d_out)
                    runs[label] = run
                times = {(label, way): [] for label in runs for way in ("ms", "back_to_back_ms")}
                for _ in range(rounds):  # the two sides alternate: a drift of the GPU's clock hits both alike
                    for label, run in runs.items():
                        times[label, "ms"].append(cuda_median_ms(run, repeats_here))
                        times[label, "back_to_back_ms"].append(cuda_back_to_back_ms(run, repeats_here))
                for (label, way), values in times.items():
                    row[f"{label}_{mode}_{way}"] = statistics.median(values)
                row[f"ratio_{mode}"] = row[f"torch_{mode}_ms"] / row[f"attnkit_{mode}_ms"]
                row[f"ratio_{mode}_back_to_back"] = (row[f"torch_{mode}_back_to_back_ms"]
                                                     / row[f"attnkit_{mode}_back_to_back_ms"])
            row["repeats"], row["rounds"] = repeats_here, rounds
            rows.append(row)
            save()  # a run cut short keeps its finished rows
            progress.update()
    return rows


def _measure(build) -> tuple[float, float]:
    """(seconds, peak extra MB) of one ``build()`` after a warm-up (and compile)."""
    build()
    seconds = []

    def run():
        start = time.perf_counter()
        build()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)

    peak = peak_extra_mb(run, "cuda")  # the harness's measure: the allocator's peak over the call
    return seconds[0], peak


def block_mask_rows(sizes, progress) -> list[dict]:
    from torch.nn.attention.flex_attention import create_block_mask

    rows = []
    for n in sizes:
        mods, flags = _torch_mods(n)

        def with_tables():
            blocks = longformer_block_mask(LONGFORMER_WINDOW, flags)
            return flex.flex_block_mask(flex_tables.tile_kinds(blocks), (n, n), blocks.mask_mod)

        row = {"n": n, "pattern": "Longformer"}
        for label, build in (("torch_compiled", lambda: create_block_mask(mods["longformer"], None, None, n, n,
                                                                            device="cuda", _compile=True)),
                             ("attnkit", lambda: longformer_block_mask(LONGFORMER_WINDOW, flags)),
                             ("attnkit_flex_tables", with_tables)):
            try:
                row[f"{label}_s"], row[f"{label}_peak_mb"] = _measure(build)
            except torch.OutOfMemoryError as error:
                row[f"{label}_error"] = f"out of memory: {str(error).splitlines()[0]}"
                torch.cuda.empty_cache()
        rows.append(row)
        progress.update()
    return rows


def markdown(report: dict) -> str:
    lines = ["| n | pattern | attnkit backend | torch fwd ms | attnkit fwd ms | ratio fwd (back to back) | "
             "torch fwd+bwd ms | attnkit fwd+bwd ms | ratio fwd+bwd (back to back) |", "|" + "---|" * 9]
    for r in report["attention"]:
        cells = [str(r["n"]), r["pattern"], r["attnkit_backend"]]
        for mode in MODES:
            if f"ratio_{mode}" not in r:  # --modes fwd: no backward row
                cells += ["-", "-", "not run"]
                continue
            cells += [f"{r[f'torch_{mode}_ms']:.3f}", f"{r[f'attnkit_{mode}_ms']:.3f}",
                      f"{r[f'ratio_{mode}']:.2f}x ({r[f'ratio_{mode}_back_to_back']:.2f}x)"]
        lines.append("| " + " | ".join(cells) + " |")
    labels = ("torch_compiled", "attnkit", "attnkit_flex_tables")
    lines += ["", "| n | block mask | " + " | ".join(f"{label} s | {label} peak MB" for label in labels) + " |",
              "|" + "---|" * (2 + 2 * len(labels))]
    for r in report["block_masks"]:
        cells = []
        for label in labels:
            for key in (f"{label}_s", f"{label}_peak_mb"):
                cells.append(f"{r[key]:.3f}" if key in r else r.get(f"{label}_error", "-"))
        lines.append(f"| {r['n']} | {r['pattern']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384, 65536, 131072])
    parser.add_argument("--mask-sizes", type=int, nargs="*", default=[65536, 1 << 20], help="none: no block-mask rows")
    parser.add_argument("--patterns", nargs="+", default=list(PATTERNS), choices=PATTERNS)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES,
                        help="fwd alone skips the backward's compiles (a structured row at 64K in a short GPU call)")
    parser.add_argument("--nan-rule", choices=["on", "off"], default="off",
                        help="on: attnkit's calls run inside attnkit.nan_rule(True) (what the rule costs; off is "
                             "attnkit's default)")
    parser.add_argument("--repeats", type=int, default=20, help="calls per measure (each alone; then back to back)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds, torch and attnkit alternating; each figure is the median over rounds")
    parser.add_argument("--long-repeats", type=int, help="calls per measure past 16K tokens (default: --repeats)")
    parser.add_argument("--batch", type=int, default=B)
    parser.add_argument("--heads", type=int, default=H)
    parser.add_argument("--head-dim", type=int, default=E)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu" / "core.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/gpu.py needs a CUDA GPU", file=sys.stderr)
        return 2
    report = gpu_report(shape={"B": args.batch, "H": args.heads, "E": args.head_dim, "dtype": "bfloat16"},
                        repeats=args.repeats, nan_rule=args.nan_rule)
    # torch's compiled flex_attention and attnkit's share one code object, and each (length, scale,
    # pattern) is a graph of its own: past dynamo's default of 8 the baseline would silently run eager.
    torch._dynamo.config.recompile_limit = 512
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report["attention"], report["block_masks"] = [], []
    with tqdm(total=len(args.patterns) * len(args.sizes) + len(args.mask_sizes), desc="gpu bench", unit="row") as progress, \
            attnkit.nan_rule(args.nan_rule == "on"):
        attention_rows(args.sizes, args.repeats, progress, save=lambda: write_json(args.out, report),
                       rows=report["attention"], patterns=args.patterns, shape=(args.batch, args.heads, args.head_dim),
                       long_repeats=args.long_repeats, modes=args.modes, rounds=args.rounds)
        report["block_masks"] = block_mask_rows(args.mask_sizes, progress)
    finish_gpu_report(args.out, report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
