"""Four index tensors of a 16 x 16 tile (B 1, H 4) as a score_mod receives them: built by four ``arange`` and four
``view`` calls (before), or copied from kept ones by four ``clone`` calls (``index_grids``, after). One thread,
no_grad, best of 15 rounds of 4,000 calls, two passes. Output: index_grids_cost.txt."""
import time

import torch

from attnkit.functional.block_mask import _grids, index_grids

torch.set_num_threads(1)
cpu = torch.device("cpu")


def t(name, f, n=4000, r=15):
    best = 1e9
    for _ in range(r):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t0) / n)
    print(f"{name:40s} {best * 1e6:7.2f} us", flush=True)


with torch.no_grad():
    for _ in range(2):
        t("arange + view, x4 (before)", lambda: _grids(1, 4, 0, 16, 0, 16, cpu))
        t("index_grids: kept, clone x4 (after)", lambda: index_grids(1, 4, 0, 16, 0, 16, cpu))
