"""The NaN rule's look as ``torch.equal(output, output)`` against ``amax().item()``, inside real calls.

    PYTHONPATH=src python benchmarks/results/overhead_ab_2026-11-27_eleventh/equal_look.py dense|mha|hf

torch.equal of a tensor with itself is one dispatch that answers a Python bool: on the CPU, PyTorch's
``cpu_equal`` takes a same-tensor fast path that scans the elements for a NaN (no reduction, no 0-dim output, no
``item``). The harness is the tenth session's ``look_variants.py`` (mha: best of 15 rounds of 3,000 masked layer
calls; hf: median of 24 rounds' median attention-function call in a tiny Llama), with its forms replaced; ``dense``
is ``attention()``'s plain call (benchmarks/overhead.py's shape), ``nan.plain_output`` replaced, best of 15 rounds
of 20,000 calls.
"""

from __future__ import annotations

import math
import pathlib
import sys
import timeit

import torch

import attnkit

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "overhead_ab_2026-11-27_tenth"))
import look_variants  # noqa: E402

look_variants.LOOKS = {
    "amax().item()": lambda o: o.amax().item(),
    "torch.equal(o, o)": lambda o: 0.0 if torch.equal(o, o) else math.nan,
    "o.equal(o)": lambda o: 0.0 if o.equal(o) else math.nan,
}
nan = look_variants.nan


def dense() -> dict[str, float]:
    q, k, v = (torch.randn(1, 4, 16, 32) for _ in range(3))
    variants = {"as is": nan.plain_output, "nothing": lambda q, k, v, dims, output, causal: output,
                **{name: look_variants.stand_in(look, 6) for name, look in look_variants.LOOKS.items()}}
    rounds: dict[str, list[float]] = {name: [] for name in variants}
    call = lambda: attnkit.attention(q, k, v)  # noqa: E731
    for _ in range(2000):
        call()
    items = list(variants.items())
    for r in range(15):
        for name, fn in items[r % len(items):] + items[:r % len(items)]:
            nan.plain_output = fn
            rounds[name].append(timeit.timeit(call, number=20000) / 20000 * 1e6)
    return {name: min(times) for name, times in rounds.items()}


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "dense"
    result = {"dense": dense, "mha": look_variants.mha, "hf": look_variants.hf}[which]()
    base = result["as is"]
    print(f"{'the look as':28s} {'us':>8s} {'vs as is':>9s}   ({which}: "
          f"{'median of the rounds medians' if which == 'hf' else 'best round'})")
    for name, us in result.items():
        print(f"{name:28s} {us:8.1f} {us - base:+9.1f}")
