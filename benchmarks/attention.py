"""Attention speed and memory against PyTorch SDPA: ``attnkit bench`` writing into benchmarks/results.

The harness lives in :mod:`attnkit.bench` (see its docstrings for how time and memory are
measured); this script only fixes the output folder. Any ``attnkit bench`` option passes through:

    python benchmarks/attention.py                                   # fp32 forward, n = 512..64K
    python benchmarks/attention.py --modes fwd+bwd --masks dense window --sizes 1024 4096 16384
    python benchmarks/attention.py --render benchmarks/results/attention.json
"""

from __future__ import annotations

import sys
from pathlib import Path

from attnkit.cli import main

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--out" not in args and "--render" not in args:
        args = ["--out", str(Path(__file__).parent / "results"), *args]
    raise SystemExit(main(["bench", *args]))
