"""Where a dense tiny attention() call's microseconds go on the CPU, each piece alone in a loop (best of five
repeats of 20,000 calls): benchmarks/overhead.py's shape (B 1, H 4, L = S = 16, E 32), one thread.

    PYTHONPATH=src python benchmarks/results/overhead_ab_2026-11-27_tenth/dense_pieces.py
"""

import math
import sys
import timeit

import torch
import torch.nn.functional as F

import attnkit
from attnkit.functional.checks import check_qkv

torch.set_num_threads(1)
torch.set_grad_enabled(False)
nan = sys.modules["attnkit.functional.nan"]
q, k, v = (torch.randn(1, 4, 16, 32) for _ in range(3))
output = F.scaled_dot_product_attention(q, k, v)
dims = check_qkv(q, k, v)


def best_us(fn) -> float:
    for _ in range(5_000):  # warm-up: the first loop of a process runs slower
        fn()
    return min(timeit.repeat(fn, number=20_000, repeat=5)) / 20_000 * 1e6


pieces = {
    "F.scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(q, k, v),
    "attnkit.attention (the NaN rule on)": lambda: attnkit.attention(q, k, v).output,
    "check_qkv": lambda: check_qkv(q, k, v),
    "the look: math.isnan(output.amax().item())": lambda: math.isnan(output.amax().item()),
    "the look as output.max().item()": lambda: output.max().item(),
    "nan.plain_output (conditions + look)": lambda: nan.plain_output(q, k, v, dims, output, False),
}
for name, fn in pieces.items():
    print(f"{name:48s} {best_us(fn):6.2f} us")
with attnkit.nan_rule(False):  # the rule off around the whole loop
    print(f"{'attnkit.attention, the NaN rule off':48s} {best_us(lambda: attnkit.attention(q, k, v).output):6.2f} us")
