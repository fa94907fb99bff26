"""SDPA's own call inside a tiny Llama's forward, under transformers' sdpa function and under the attnkit bridge:
``F.scaled_dot_product_attention`` wrapped in a timer (both reach it through ``torch.nn.functional``), 30 warm-up
forwards, then 500; the median call and its arguments.

    PYTHONPATH=src python benchmarks/results/overhead_ab_2026-11-27_tenth/hf_bridge/sdpa_in_context.py
"""

import copy
import statistics
import time

import torch
import torch.nn.functional as F
import transformers

import attnkit.hf

torch.set_num_threads(1)
torch.set_grad_enabled(False)
attnkit.hf.register()
config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=256)
real = F.scaled_dot_product_attention
calls: list[int] = []
seen: list[dict] = []


def timed(*args, **kwargs):
    start = time.perf_counter_ns()
    result = real(*args, **kwargs)
    calls.append(time.perf_counter_ns() - start)
    seen.append({"q": tuple(args[0].shape), "k": tuple(args[1].shape),
                 **{key: value for key, value in kwargs.items() if not isinstance(value, torch.Tensor)}})
    return result


torch.nn.functional.scaled_dot_product_attention = timed
ids = torch.randint(0, 256, (1, 16))
for implementation in ("sdpa", "attnkit"):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(copy.deepcopy(config), attn_implementation=implementation)
    model.eval()
    for _ in range(30):
        model(ids, use_cache=False)
    calls.clear()
    seen.clear()
    for _ in range(500):
        model(ids, use_cache=False)
    print(f"{implementation:8s} SDPA median {statistics.median(calls) / 1000:6.2f} us, "
          f"quartile {sorted(calls)[len(calls) // 4] / 1000:6.2f} us; {seen[0]}")
