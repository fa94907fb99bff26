"""The NaN rule's look, ``amax().item()`` against ``max().item()``, on a contiguous (B, H, L, E) output (what a plain
attention() call's SDPA returns) and on a transposed one, (B, L, H, E) in memory (what SDPA returns for a layer's
projected heads). B 1, H 4, L 16, E 32, float32, one thread; the four alternate, 40 rounds of 2,000 calls, the
best round each. Output: look_layout.txt."""
import math
import time

import torch

torch.set_num_threads(1)
transposed = torch.randn(1, 16, 4, 32).transpose(1, 2)
contiguous = torch.randn(1, 4, 16, 32)
looks = {
    "amax().item(), transposed": lambda: math.isnan(transposed.amax().item()),
    "max().item(), transposed": lambda: math.isnan(transposed.max().item()),
    "amax().item(), contiguous": lambda: math.isnan(contiguous.amax().item()),
    "max().item(), contiguous": lambda: math.isnan(contiguous.max().item()),
}
best = dict.fromkeys(looks, math.inf)
with torch.no_grad():
    for _ in range(40):
        for name, look in looks.items():
            start = time.perf_counter()
            for _ in range(2000):
                look()
            best[name] = min(best[name], (time.perf_counter() - start) / 2000)
for name, seconds in best.items():
    print(f"{name:30s} {seconds * 1e6:5.2f} us")
