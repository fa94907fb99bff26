"""Where a plain tiny attention() call spends its time over SDPA, inside the call (benchmarks/overhead.py's shape,
one thread): check_qkv and the NaN rule (nan.plain_output) each stood in for by nothing, the variants alternating
round by round, best of 15 rounds of 20,000 calls; SDPA alone timed in the same rounds.

    PYTHONPATH=src python benchmarks/results/overhead_ab_2026-11-27_eleventh/dense_in_context.py
"""

import sys
import timeit

import torch
import torch.nn.functional as F

import attnkit

torch.set_num_threads(1)
torch.set_grad_enabled(False)
module = sys.modules["attnkit.functional.attention"]
nan = sys.modules["attnkit.functional.nan"]
q, k, v = (torch.randn(1, 4, 16, 32) for _ in range(3))
dims = module.check_qkv(q, k, v)


def given_dims(q, k, v):
    return dims


def no_rule(q, k, v, dims, output, causal):
    return output


VARIANTS = {"as is": (module.check_qkv, nan.plain_output), "no check_qkv": (given_dims, nan.plain_output),
            "no rule": (module.check_qkv, no_rule), "neither": (given_dims, no_rule)}


def main() -> None:
    def sdpa():
        return F.scaled_dot_product_attention(q, k, v)

    def call():
        return attnkit.attention(q, k, v)

    for _ in range(3000):
        call()
        sdpa()
    rounds: dict[str, list[float]] = {name: [] for name in [*VARIANTS, "sdpa"]}
    items = list(VARIANTS.items())
    for r in range(15):
        for name, (check, rule) in items[r % 4:] + items[:r % 4]:
            module.check_qkv, nan.plain_output = check, rule
            rounds[name].append(timeit.timeit(call, number=20000) / 20000 * 1e6)
        rounds["sdpa"].append(timeit.timeit(sdpa, number=20000) / 20000 * 1e6)
    for name, times in rounds.items():
        print(f"{name:14s} {min(times):6.2f}")


if __name__ == "__main__":
    main()
