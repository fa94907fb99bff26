"""Four index tensors of a 16 x 16 tile (B 1, H 4) as a score_mod receives them: built by four ``arange`` and four
``view`` calls (before), or copied from kept ones by four ``clone`` calls (``index_grids``, after). One thread,
no_grad, best of 15 rounds of 4,000 calls, two passes. Output: index_grids_cost.txt."""
import torch
from _timing import t  # (this folder's timer)

from attnkit.functional.block_mask import _grids, index_grids

torch.set_num_threads(1)
cpu = torch.device("cpu")




with torch.no_grad():
    for _ in range(2):
        t("arange + view, x4 (before)", lambda: _grids(1, 4, 0, 16, 0, 16, cpu))
        t("index_grids: kept, clone x4 (after)", lambda: index_grids(1, 4, 0, 16, 0, 16, cpu))
