"""What the torch.func transform check costs a plain attention() call (benchmarks/overhead.py's shape), in one
process: nan.looks_first as it is (compiling, or a transform active: two checks) against the old form (compiling
only), alternating round by round, best of 20 rounds of 10,000 calls.

    PYTHONPATH=src python benchmarks/results/overhead_ab_2026-11-27_eleventh/transform_check.py
"""

import sys
import timeit

import torch

import attnkit

torch.set_num_threads(1)
torch.set_grad_enabled(False)
nan = sys.modules["attnkit.functional.nan"]
q, k, v = (torch.randn(1, 4, 16, 32) for _ in range(3))


def old(q, k, v):
    if q.is_cpu:
        return not torch.compiler.is_compiling()
    raise AssertionError("the CPU only")


VARIANTS = {"inline (new)": nan.looks_first, "is_compiling only (old)": old}


def main() -> None:
    def call():
        return attnkit.attention(q, k, v)

    for _ in range(3000):
        call()
    rounds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    items = list(VARIANTS.items())
    for r in range(20):
        for name, fn in items[r % 2:] + items[:r % 2]:
            nan.looks_first = fn
            rounds[name].append(timeit.timeit(call, number=10000) / 10000 * 1e6)
    print({name: round(min(times), 2) for name, times in rounds.items()})


if __name__ == "__main__":
    main()
