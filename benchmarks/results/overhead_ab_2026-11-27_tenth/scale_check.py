"""What attention()'s check of a given scale cost inside a transformers layer call, on code before the check's
fast path (c236f1c): the check as it was, with ``torch.finfo`` read from a table, and not at all, alternating
round by round (30 rounds of 60 forwards of a tiny Llama, 16 tokens; the registered attention function's median
call per round, the median of those). transformers passes its ``scaling`` on every call.

    PYTHONPATH=<c236f1c's src> python benchmarks/results/overhead_ab_2026-11-27_tenth/scale_check.py
"""

import copy
import math
import statistics
import sys
import time

import torch
import transformers
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import attnkit.hf

torch.set_num_threads(1)
torch.set_grad_enabled(False)
attnkit.hf.register()
module = sys.modules["attnkit.functional.attention"]
config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=256)
calls: list[int] = []
real = ALL_ATTENTION_FUNCTIONS["attnkit"]


def timed(*args, **kwargs):
    start = time.perf_counter_ns()
    result = real(*args, **kwargs)
    calls.append(time.perf_counter_ns() - start)
    return result


ALL_ATTENTION_FUNCTIONS["attnkit"] = timed
torch.manual_seed(0)
model = transformers.LlamaForCausalLM._from_config(copy.deepcopy(config), attn_implementation="attnkit").eval()
ids = torch.randint(0, 256, (1, 16))
largest = {dtype: torch.finfo(dtype).max for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16)}


def finfo_from_a_table(scale, dims, dtype):
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(scale)
    if abs(scale) * max(1, dims.E) > largest[dtype]:
        raise ValueError(scale)
    return float(scale)


variants = {"the check as it was": module._checked_scale, "torch.finfo from a table": finfo_from_a_table,
            "no check": lambda scale, dims, dtype: scale}
rounds: dict[str, list[float]] = {name: [] for name in variants}
for _ in range(30):
    model(ids, use_cache=False)
items = list(variants.items())
for r in range(30):
    for name, fn in items[r % len(items):] + items[:r % len(items)]:
        module._checked_scale = fn
        calls.clear()
        for _ in range(60):
            model(ids, use_cache=False)
        rounds[name].append(statistics.median(calls) / 1000)
base = statistics.median(rounds["the check as it was"])
for name, times in rounds.items():
    print(f"{name:28s} {statistics.median(times):6.1f} us {statistics.median(times) - base:+5.1f}")
