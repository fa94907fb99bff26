"""The dense tiny call (B 1, H 4, L = S = 16, E 32, float32, one thread) with the NaN rule on and off, beside SDPA and
the rule's pieces: what the <= 1.3x target leaves the rule. Best of 5 rounds of 20,000 calls each.

    .venv/bin/python benchmarks/results/overhead_ab_2026-11-28_thirteenth/dense_rule_cost.py
"""

import timeit

import torch
import torch.nn.functional as F

import attnkit
from attnkit.functional import nan

torch.set_num_threads(1)
q, k, v = (torch.randn(1, 4, 16, 32, generator=torch.Generator().manual_seed(i)) for i in range(3))
out = F.scaled_dot_product_attention(q, k, v)


def us(function) -> float:
    return min(timeit.repeat(function, number=20000, repeat=5)) / 20000 * 1e6


sdpa = us(lambda: F.scaled_dot_product_attention(q, k, v))
on = us(lambda: attnkit.attention(q, k, v))
with nan.nan_rule(False):
    off = us(lambda: attnkit.attention(q, k, v))
print(f"torch {torch.__version__}")
print(f"SDPA                     {sdpa:6.2f} us")
print(f"attention, rule on       {on:6.2f} us  {on / sdpa:.2f}x")
print(f"attention, rule off      {off:6.2f} us  {off / sdpa:.2f}x")
print(f"nan.holds_nan(output)    {us(lambda: nan.holds_nan(out)):6.2f} us")
print(f"output.equal(output)     {us(lambda: out.equal(out)):6.2f} us")
