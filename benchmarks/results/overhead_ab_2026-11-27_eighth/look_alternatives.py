"""Looks that were tried and not kept, against the rule's look, each timed alone, in random order, best of 40 rounds
(one process, one thread): a NumPy dot product of the output with itself (NaN-exact: squares cannot cancel to NaN,
and IEEE arithmetic carries a NaN through every product and sum), bare and with the conditions it needs (float32
or float64, no gradient, a plain CPU tensor, small enough for OpenBLAS's one thread); and the packed projection's
per-tensor check, ``is_set_to``, against a ``data_ptr`` comparison.

    PYTHONPATH=src python benchmarks/results/overhead_ab_2026-11-27_eighth/look_alternatives.py
"""

import math

import torch
import torch.nn.functional as F
from _shuffled import best_us

torch.set_num_threads(1)
generator = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 4, 16, 32, generator=generator) for _ in range(3))
output = F.scaled_dot_product_attention(q, k, v)
DOT_DTYPES = (torch.float32, torch.float64)


def numpy_dot() -> bool:
    flat = output.numpy().ravel()
    return math.isnan(flat.dot(flat))


def numpy_dot_with_its_conditions() -> bool:
    x = output
    if x.numel() <= 8192 and x.dtype in DOT_DTYPES and not x.requires_grad and x.is_cpu and type(x) is torch.Tensor:
        return numpy_dot()
    return math.isnan(x.amax().item())


weight = torch.nn.Parameter(torch.randn(384, 128))
part = weight.data[:128]
projection = torch.nn.Parameter(torch.randn(128, 128))
projection.data = part

looks = {
    "the rule's look: output.amax().item()": lambda: math.isnan(output.amax().item()),
    "output.max().item()": lambda: math.isnan(output.max().item()),
    "NumPy: output.numpy().ravel(), a.dot(a)": numpy_dot,
    "the same with the conditions it needs": numpy_dot_with_its_conditions,
    "packed check: weight.is_set_to(part)": lambda: projection.is_set_to(part),
    "weight.data_ptr() == part.data_ptr()": lambda: projection.data_ptr() == part.data_ptr(),
}
for name, us in best_us(looks, calls=5000).items():
    print(f"{name:42s} {us:6.2f} us")
