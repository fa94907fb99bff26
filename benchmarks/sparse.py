"""Sparse attention patterns against PyTorch SDPA with the equivalent boolean mask and compiled
flex_attention: ``attnkit bench --masks band longformer bigbird documents sinks`` writing into
benchmarks/results/sparse (see attnkit.bench.attention for how time and memory are measured).

    python benchmarks/sparse.py --modes fwd --out benchmarks/results/sparse/fwd        # the runs in
    python benchmarks/sparse.py --modes fwd+bwd --masks band longformer documents \
        --out benchmarks/results/sparse/fwd+bwd                                        # docs/performance.md
    python benchmarks/sparse.py --sizes 4096 --modes fwd               # any attnkit bench option

Nothing else may run on the machine meanwhile: the tiled backend's many small parallel regions
slow down tenfold when OpenMP threads are oversubscribed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from attnkit.cli import main

DEFAULTS = {
    "--out": [str(Path(__file__).parent / "results" / "sparse")],
    "--masks": ["band", "longformer", "bigbird", "documents", "sinks"],
    "--sizes": ["4096", "16384"],
    "--modes": ["fwd", "fwd+bwd"],
    "--impls": ["torch-sdpa", "torch-flex", "tiled", "flex", "auto"],
}

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--render" not in args:
        for option, values in DEFAULTS.items():
            if option not in args:
                args += [option, *values]
    raise SystemExit(main(["bench", *args]))
