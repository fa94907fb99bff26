"""How long :func:`attnkit.viz.plot_heads` takes to write one PNG grid: what ``attnkit inspect`` draws once per
layer (30 grids for SmolLM2). H heads of an L x L attention over labelled tokens, written to a temporary folder;
each size drawn ``--repeats`` times after one warm-up, the minimum and the median kept. Prints a table and writes
JSON (``--out``, atomically).

    python benchmarks/heads_grid.py [--heads 4 9 16] [--tokens 15] [--repeats 5] [--out ...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from attnkit import viz
from attnkit._files import write_json
from attnkit._markdown import markdown_table
from attnkit.bench import machine_info


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, nargs="+", default=[4, 9, 16])
    parser.add_argument("--tokens", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "heads_grid.json")
    args = parser.parse_args(argv)
    rows = []
    report = {"benchmark": "heads_grid", "machine": machine_info("cpu"), "tokens": args.tokens, "rows": rows}
    rng = np.random.default_rng(0)
    labels = [f"tok{i}" for i in range(args.tokens)]
    with tempfile.TemporaryDirectory() as folder:
        for heads in args.heads:
            weights = rng.dirichlet(np.ones(args.tokens), size=(heads, args.tokens))
            seconds = []
            for attempt in range(args.repeats + 1):
                start = time.perf_counter()
                viz.plot_heads(weights, Path(folder) / f"{heads}-{attempt}.png", x_labels=labels, y_labels=labels,
                               title=f"{heads} heads")
                if attempt:  # the first draw warms matplotlib's caches
                    seconds.append(time.perf_counter() - start)
            rows.append({"heads": heads, "min_s": min(seconds), "median_s": statistics.median(seconds)})
            write_json(args.out, report)
    print("\n".join(markdown_table(["heads", "min s", "median s"],
                                   [[r["heads"], f"{r['min_s']:.2f}", f"{r['median_s']:.2f}"] for r in rows])))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
