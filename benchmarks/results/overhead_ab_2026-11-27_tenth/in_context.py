"""What a piece of a MultiHeadAttention call costs inside the call, against what it costs alone.

A masked self-attention call of benchmarks/overhead.py's layer (D 128, H 4, L 16, a (B, 1, 1, S) boolean mask), one
thread, timed with one piece stood in for at a time: the variants alternate round by round (15 rounds of 3,000
calls; the best five rounds printed, the best one kept). Beside it, each piece alone in a loop of its own, where
its code stays hot. A piece whose code goes cold between calls (a C++ stream, a reduction kernel) costs several
times more inside the call than alone.

    PYTHONPATH=src python benchmarks/results/overhead_ab_2026-11-27_tenth/in_context.py OUT.json
"""

from __future__ import annotations

import json
import math
import sys
import timeit

import torch

import attnkit
from attnkit.functional import attention as _attention_module  # noqa: F401  (the package's module, below)

torch.set_num_threads(1)
torch.set_grad_enabled(False)
module = sys.modules["attnkit.functional.attention"]
nan = sys.modules["attnkit.functional.nan"]
B, L, D, H = 1, 16, 128, 4
torch.manual_seed(0)
layer = attnkit.MultiHeadAttention(D, H).eval()
x = torch.randn(B, L, D)
mask = torch.ones(B, 1, 1, L, dtype=torch.bool)
mask[-1, ..., -3:] = False
check_mask, masked_output = module.check_mask, nan.masked_output


def no_check(mask, dims, device):
    return None


def device_type_read(mask, dims, device):  # the old check's last comparison, alone
    return device.type == "cpu"


def device_compare(mask, dims, device):  # the new one
    return mask.device == device


variants = {
    "as is": (check_mask, masked_output),
    "check_mask: nothing": (no_check, masked_output),
    "check_mask: one device.type read": (device_type_read, masked_output),
    "check_mask: one device comparison": (device_compare, masked_output),
    "the NaN rule's look: nothing": (check_mask, lambda q, k, v, dims, output: output),
}
rounds: dict[str, list[float]] = {name: [] for name in variants}
call = lambda: layer(x, mask=mask)  # noqa: E731
for _ in range(300):
    call()
for _ in range(15):
    for name, (check, look) in variants.items():
        module.check_mask, nan.masked_output = check, look
        rounds[name].append(timeit.timeit(call, number=3000) / 3000 * 1e6)
module.check_mask, nan.masked_output = check_mask, masked_output

q = torch.randn(B, H, L, D // H)
output = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
device = q.device
alone = {
    "device.type": lambda: device.type,
    "mask.device == device": lambda: mask.device == device,
    "output.amax().item()": lambda: math.isnan(output.amax().item()),
}
alone_us = {name: min(timeit.repeat(fn, number=100_000, repeat=5)) / 100_000 * 1e6 for name, fn in alone.items()}

base = min(rounds["as is"])
print(f"{'variant of the masked layer call':<40} {'best us':>8} {'vs as is':>9}   best five rounds")
for name, times in rounds.items():
    best = sorted(times)[:5]
    print(f"{name:<40} {best[0]:8.1f} {best[0] - base:+9.1f}   " + " ".join(f"{t:.1f}" for t in best))
print()
for name, us in alone_us.items():
    print(f"alone: {name:<30} {us:6.2f} us")
with open(sys.argv[1] if len(sys.argv) > 1 else "in_context.json", "w") as f:
    json.dump({"torch": torch.__version__, "rounds_us": rounds, "alone_us": alone_us}, f, indent=1)
