"""Where ``auto`` should send a CPU call with a ``score_mod``: the tiled loop against the reference backend's
written-out softmax, by length (the measurement behind ``routing.AUTO_SCORE_MOD_REFERENCE_MAX_ENTRIES``).

B 1, H 4, E 32, float32, one thread, no gradients, tanh softcapping (30 tanh(s / 30)), L = S at each size; each
size times both backends round robin (benchmarks' harness) and asserts they agree (1e-5). Prints a table and
writes JSON (``--out``, atomically).

    python benchmarks/score_mod_routing.py [--sizes 16 32 64 128 256 512 1024] [--out ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import attnkit
from attnkit._files import write_json
from attnkit._markdown import markdown_table
from attnkit.bench import machine_info
from attnkit.bench.harness import time_round_robin


def softcap(score, b, h, q_idx, kv_idx):
    return 30 * torch.tanh(score / 30)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512, 1024])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "score_mod_routing.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    report = {"benchmark": "score_mod_routing", "machine": machine_info("cpu"), "threads": 1, "rows": rows,
              "shape": {"B": 1, "H": 4, "E": 32, "dtype": "float32"}}
    generator = torch.Generator().manual_seed(0)
    for n in args.sizes:
        q, k, v = (torch.randn(1, 4, n, 32, generator=generator) for _ in range(3))
        calls = {name: (lambda name=name: attnkit.attention(q, k, v, score_mod=softcap, backend=name).output)
                 for name in ("tiled", "reference")}
        with torch.no_grad():
            torch.testing.assert_close(calls["tiled"](), calls["reference"](), rtol=1e-5, atol=1e-5)
            times = time_round_robin(calls, repeats=5, min_seconds=0.3)
        rows.append({"n": n, "entries": n * n, **{f"{name}_us": t["time_s"] * 1e6 for name, t in times.items()}})
        rows[-1]["reference_over_tiled"] = rows[-1]["reference_us"] / rows[-1]["tiled_us"]
        write_json(args.out, report)
    print("\n".join(markdown_table(["L = S", "scores", "tiled us", "reference us", "reference / tiled"],
                                   [[r["n"], f"{r['entries']:,}", f"{r['tiled_us']:.1f}", f"{r['reference_us']:.1f}",
                                     f"{r['reference_over_tiled']:.2f}"] for r in rows])))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
