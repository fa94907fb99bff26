"""Where a tiny masked call's microseconds go: attention() with a padding mask beside SDPA with the same mask and
the pieces attention() runs, each timed alone, in random order, best of 40 rounds (one process, one thread).

    PYTHONPATH=src python benchmarks/results/overhead_ab_2026-11-27_eighth/masked_pieces.py
"""

import math

import torch
import torch.nn.functional as F
from _shuffled import best_us

import attnkit
from attnkit import masks
from attnkit.functional import nan
from attnkit.functional.checks import check_mask, check_qkv

torch.set_num_threads(1)
B, H, L, E = 1, 4, 16, 32
generator = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(B, H, L, E, generator=generator) for _ in range(3))
padding = masks.padding(torch.tensor([L - 3]), L)
dims = check_qkv(q, k, v)
output = F.scaled_dot_product_attention(q, k, v, attn_mask=padding)


pieces = {
    "F.sdpa with the mask": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=padding),
    "attnkit.attention": lambda: attnkit.attention(q, k, v, mask=padding),
    "check_qkv": lambda: check_qkv(q, k, v),
    "check_mask": lambda: check_mask(padding, dims, q.device),
    "the look: output.amax().item()": lambda: math.isnan(output.amax().item()),
    "q, k and v read: nan.poisoned_rows": lambda: nan.poisoned_rows(q, k, v, dims),
    "torch._foreach_max([q, k, v])": lambda: torch._foreach_max([q, k, v]),
}
for name, us in best_us(pieces, calls=4000).items():
    print(f"{name:40s} {us:6.2f} us")
