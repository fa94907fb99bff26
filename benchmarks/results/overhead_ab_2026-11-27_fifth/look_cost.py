"""The dense tiny call (B 1, H 4, L = S = 16, E 32, float32, one thread): SDPA alone, and ways of looking for a NaN
in its output (the NaN rule's look: a reduction and a host read). Best of 15 rounds of 4,000 calls, two passes.
Output: look_cost.txt."""
import math

import numpy as np
import torch
import torch.nn.functional as F
from _timing import t  # (this folder's timer)

torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 4, 16, 32, generator=g) for _ in range(3))
out = F.scaled_dot_product_attention(q, k, v)
flat = out.view(-1)




def numpy_dot():
    a = out.numpy().ravel()
    return math.isnan(np.dot(a, a))


for _ in range(2):
    t("F.scaled_dot_product_attention", lambda: F.scaled_dot_product_attention(q, k, v))
    t("amax().item()", lambda: math.isnan(out.amax().item()))
    t("max().item()", lambda: math.isnan(out.max().item()))
    t("sum().item()", lambda: math.isnan(out.sum().item()))
    t("torch.dot(flat, flat).item()", lambda: math.isnan(torch.dot(flat, flat).item()))
    t("numpy: ravel, dot", numpy_dot)
    t("numpy: max", lambda: math.isnan(out.numpy().max()))
    t("isnan().any()", lambda: bool(out.isnan().any()))
