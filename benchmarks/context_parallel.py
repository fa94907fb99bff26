"""Context-parallel attention on this machine (``attnkit bench --context-parallel N``): per-process
peak memory, time, bytes sent against the formula, and zigzag vs contiguous balance for causal
attention, at W = 1, 2, 4 gloo processes. Writes benchmarks/results/context_parallel/context_parallel.json.

    python benchmarks/context_parallel.py                 # n = 32768, causal, forward
    python benchmarks/context_parallel.py 65536 --backward
"""

from __future__ import annotations

import sys
from pathlib import Path

from attnkit.cli import main

if __name__ == "__main__":
    args = sys.argv[1:]
    n = args.pop(0) if args and not args[0].startswith("-") else "32768"
    if "--out" not in args:
        args = ["--out", str(Path(__file__).parent / "results" / "context_parallel"), *args]
    raise SystemExit(main(["bench", "--context-parallel", n, *args]))
