"""The linear core on a GPU against flash-linear-attention's Triton kernels, called through attnkit and directly.

Qwen3-Next's linear-attention shape, as benchmarks/linear_attention.py on the CPU: B 1, 16 heads of 128 (keys
and values), chunk 64, bf16 q/k/v, float32 log-decays g = -0.2 softplus(x), beta in (0, 1), q and k
L2-normalised in the kernel (the delta rule). Rows, at each length, forward (no grad) and forward+backward:

    gdr-attnkit        attnkit.functional.linear.gated_delta_rule as a user calls it (backend "auto": fla's
                       kernel where fla-core is installed, attnkit's chunked form otherwise)
    gdr-attnkit-torch  the same with backend="torch": attnkit's exact chunked form, PyTorch ops
    gdr-fla            fla.ops.gated_delta_rule.chunk_gated_delta_rule called directly (fla's own layout)
    gdr-transformers   transformers' torch_chunk_gated_delta_rule (Qwen3-Next's PyTorch fallback; where fla is
                       installed transformers itself hands the call to fla's kernel, so there this row is fla's
                       again: seen on an H200 with transformers 5.17, the same times and outputs)
    gla-attnkit        attnkit.functional.linear.gated_linear_attention (a decay a head: lightning attention
                       and Mamba-2's SSD), backend "auto"
    gla-attnkit-torch  the same with backend="torch"
    gla-fla            fla.ops.simple_gla.chunk_simple_gla called directly
    sdpa-causal        attnkit.attention(is_causal=True) at the same shape (what a softmax layer costs)

Each row: CUDA-event median of ``--repeats`` calls after a warm-up (Triton's compiles included), the peak
extra MB over one call, and, against its family's fla row, fla's time over the row's (the target for the auto
rows: >= 0.95x) and the largest difference to fla's output relative to its largest magnitude (bf16 rounding:
~1e-2). A row whose package is missing is recorded with that reason. Writes JSON (``--out``, atomically, after
every row) naming the machine (device, driver, torch, Triton, transformers, fla, commit) and prints a table.

    python benchmarks/gpu_linear.py --out benchmarks/results/gpu/linear.json
    python benchmarks/gpu_linear.py --device cpu --sizes 256 --repeats 1     # a smoke run (no fla on the CPU)
"""

from __future__ import annotations

import argparse
import importlib.metadata
from pathlib import Path

import torch

import attnkit
from attnkit._files import write_json
from attnkit._markdown import markdown_table
from attnkit.bench.harness import machine_info, median_ms, peak_extra_mb
from attnkit.functional.linear import gated_delta_rule, gated_linear_attention

H, E, CHUNK = 16, 128, 64
ROWS = ("gdr-attnkit", "gdr-attnkit-torch", "gdr-fla", "gdr-transformers", "gla-attnkit", "gla-attnkit-torch",
        "gla-fla", "sdpa-causal")


def _inputs(n: int, device: str, seed: int = 0):
    """q, k, v (bf16, attnkit's (B, H, L, E)), g and beta (float32 and bf16, (B, H, L))."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, H, n, E, generator=generator).to(device, torch.bfloat16) for _ in range(3))
    g = (-0.2 * torch.nn.functional.softplus(torch.randn(1, H, n, generator=generator))).to(device)
    beta = torch.rand(1, H, n, generator=generator).to(device, torch.bfloat16)
    return q, k, v, g, beta


def _function(row: str):
    """The row's call on attnkit's layout, (q, k, v, g, beta) -> output (B, H, L, E); ImportError if missing."""
    def t(x):  # (B, H, L, ...) <-> (B, L, H, ...): fla's and transformers' layout
        return x.transpose(1, 2).contiguous()

    if row in ("gdr-attnkit", "gdr-attnkit-torch"):
        backend = "torch" if row.endswith("torch") else "auto"
        return lambda q, k, v, g, beta: gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, chunk_size=CHUNK,
                                                         backend=backend).output
    if row in ("gla-attnkit", "gla-attnkit-torch"):
        backend = "torch" if row.endswith("torch") else "auto"
        return lambda q, k, v, g, beta: gated_linear_attention(q, k, v, g, chunk_size=CHUNK, backend=backend).output
    if row == "gla-fla":
        from fla.ops.simple_gla import chunk_simple_gla

        return lambda q, k, v, g, beta: t(chunk_simple_gla(t(q), t(k), t(v), t(g))[0])
    if row == "gdr-fla":
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        return lambda q, k, v, g, beta: t(chunk_gated_delta_rule(t(q), t(k), t(v), t(g), t(beta),
                                                                 use_qk_l2norm_in_kernel=True)[0])
    if row == "gdr-transformers":
        from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

        return lambda q, k, v, g, beta: t(torch_chunk_gated_delta_rule(t(q), t(k), t(v), t(g), t(beta),
                                                                       chunk_size=CHUNK,
                                                                       use_qk_l2norm_in_kernel=True)[0])
    return lambda q, k, v, g, beta: attnkit.attention(q, k, v, is_causal=True).output


def measure(n: int, rows, repeats: int, device: str, report: dict, save) -> None:
    inputs = _inputs(n, device)
    outputs: dict[str, torch.Tensor] = {}
    for row in rows:
        record: dict = {"n": n, "row": row}
        report["rows"].append(record)
        try:
            function = _function(row)
        except ImportError as exc:
            record["error"] = f"not installed: {exc}"
            save()
            continue
        try:
            with torch.no_grad():
                outputs[row] = function(*inputs).float()

            def forward(function=function):
                with torch.no_grad():
                    function(*inputs)

            leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
            d_out = torch.randn_like(outputs[row]).to(inputs[0].dtype)

            def backward(function=function):
                function(*leaves).backward(d_out)
                for leaf in leaves:
                    leaf.grad = None

            record["fwd_ms"] = median_ms(forward, repeats, device)
            record["fwd_peak_extra_mb"] = peak_extra_mb(forward, device)
            record["fwd+bwd_ms"] = median_ms(backward, repeats, device)
        except Exception as exc:  # a row that cannot run here is recorded with its reason, not hidden
            record["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        save()
    by_row = {r["row"]: r for r in report["rows"] if r["n"] == n}
    for row, record in by_row.items():
        family = row.split("-")[0]  # gdr, gla: each row against its family's fla row
        fla_row = f"{family}-fla"
        if row == fla_row or fla_row not in by_row:
            continue
        if row in outputs and fla_row in outputs:
            reference = outputs[fla_row]
            record["max_rel_diff_to_fla"] = float((outputs[row] - reference).abs().max() / reference.abs().max())
        for mode in ("fwd", "fwd+bwd"):
            if f"{mode}_ms" in record and f"{mode}_ms" in by_row[fla_row]:
                record[f"fla_over_this_{mode}"] = by_row[fla_row][f"{mode}_ms"] / record[f"{mode}_ms"]
    save()


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384, 65536])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    parser.add_argument("--sdpa-max", type=int, default=65536, help="softmax rows up to this length")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu" / "linear.json")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: this machine has no CUDA device (use --device cpu for a smoke run)")
    machine = machine_info(args.device) | {"fla_core": _version("fla-core")}
    report = {"benchmark": "gpu_linear", "config": vars(args) | {"out": str(args.out)},
              "shape": {"B": 1, "H": H, "E": E, "chunk": CHUNK, "dtype": "bfloat16"}, "machine": machine,
              "rows": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        write_json(args.out, report)

    for n in args.sizes:
        rows = [row for row in args.rows if row != "sdpa-causal" or n <= args.sdpa_max]
        measure(n, rows, args.repeats, args.device, report, save)
        for record in report["rows"]:
            if record["n"] == n:
                print(f"  n {n:>6}  {record['row']:<18} fwd {record.get('fwd_ms', float('nan')):9.2f} ms  "
                      f"fwd+bwd {record.get('fwd+bwd_ms', float('nan')):9.2f} ms  {record.get('error', '')}", flush=True)

    def cell(record, key, form):
        return form.format(record[key]) if key in record else record.get("error", "-")[:40] if key.endswith("ms") else "-"

    print("\n".join(markdown_table(
        ["n", "row", "fwd ms", "fwd+bwd ms", "fwd peak extra MB", "fla / this fwd", "fla / this fwd+bwd",
         "max rel diff to fla"],
        [[r["n"], r["row"], cell(r, "fwd_ms", "{:.2f}"), cell(r, "fwd+bwd_ms", "{:.2f}"),
          cell(r, "fwd_peak_extra_mb", "{:.0f}"), cell(r, "fla_over_this_fwd", "{:.2f}x"),
          cell(r, "fla_over_this_fwd+bwd", "{:.2f}x"), cell(r, "max_rel_diff_to_fla", "{:.1e}")]
         for r in report["rows"]])))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
