"""The pieces of a tiny MultiHeadAttention call (D 128, H 4, L 16) and of a dense attention() call, best of 30 rounds
of 300 calls, one thread: python benchmarks/results/overhead_ab_2026-11-27_packed/pieces.py > pieces.txt"""
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import attnkit
from attnkit.functional import nan

torch.set_num_threads(1)
B, L, D, H = 1, 16, 128, 4
torch.manual_seed(0)
layer = attnkit.MultiHeadAttention(D, H).eval()
theirs = nn.MultiheadAttention(D, H, batch_first=True).eval()
x = torch.randn(B, L, D)
Wq, Wk, Wv, Wo = layer.q_proj, layer.k_proj, layer.v_proj, layer.out_proj
W3, b3 = torch.cat([Wq.weight, Wk.weight, Wv.weight]), torch.cat([Wq.bias, Wk.bias, Wv.bias])
q, k, v = (torch.randn(B, H, L, D // H) for _ in range(3))
out = F.scaled_dot_product_attention(q, k, v)


def nan_rule_off():
    with nan.nan_rule(False):
        return attnkit.attention(q, k, v)


fns = {
    "MultiHeadAttention": lambda: layer(x),
    "nn.MultiheadAttention": lambda: theirs(x, x, x, need_weights=False),
    "one projection (F.linear, 128 -> 128)": lambda: F.linear(x, Wq.weight, Wq.bias),
    "packed projection (F.linear, 128 -> 384)": lambda: F.linear(x, W3, b3),
    "SDPA, dense": lambda: F.scaled_dot_product_attention(q, k, v),
    "attention(), dense": lambda: attnkit.attention(q, k, v),
    "attention(), dense, NaN rule off": nan_rule_off,
    "the NaN rule's look (output.amax().item())": lambda: out.amax().item(),
}
best = {name: float("inf") for name in fns}
with torch.no_grad():
    for _ in range(30):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(300):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / 300 * 1e6)
for name, us in best.items():
    print(f"{name:45s} {us:7.2f} us")
sys.exit(0)
