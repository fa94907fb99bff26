"""The two looks for a NaN, timed alone (hot) by size and dtype on one thread: ``math.isnan(x.amax().item())``
(a vectorised reduction, a 0-dim output, a host read) against ``x.equal(x)`` (one dispatch; PyTorch's CPU
``equal`` scans a tensor compared with itself for a NaN, element by element). Best of 7 repeats of 500 calls.

    python benchmarks/results/overhead_ab_2026-11-27_eleventh/equal_sizes.py
"""

import math
import timeit

import torch

torch.set_num_threads(1)
SIZES = (512, 1024, 2048, 4096, 8192, 16384)
print(f"{'dtype':16s}" + "".join(f"{n:>16d}" for n in SIZES) + "   (us: amax / equal)")
for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
    row = []
    for numel in SIZES:
        x = torch.randn(numel).to(dtype)
        amax = min(timeit.repeat(lambda: math.isnan(x.amax().item()), number=500, repeat=7)) / 500 * 1e6
        equal = min(timeit.repeat(lambda: x.equal(x), number=500, repeat=7)) / 500 * 1e6
        row.append(f"{amax:7.2f} /{equal:6.2f}")
    print(f"{str(dtype):16s}" + "".join(f"{cell:>16s}" for cell in row))
print(torch.__version__, torch.backends.cpu.get_cpu_capability())
