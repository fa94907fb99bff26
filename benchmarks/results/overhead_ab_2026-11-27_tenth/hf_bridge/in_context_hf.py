"""What transformers' attention function (per layer call) and mask function (per forward) cost inside a model's
forward, attn_implementation "attnkit" against "sdpa": a tiny Llama (4 layers, hidden 128, 4 heads, 2 key/value
heads), 16 tokens, no cache, one thread. Each registered function is wrapped in a timer; three rounds of 500
forwards a model, the median call of each round printed (and the forward's mean).

    PYTHONPATH=src python benchmarks/results/overhead_ab_2026-11-27_tenth/hf_bridge/in_context_hf.py OUT.json
"""

import copy
import json
import statistics
import sys
import time

import torch
import transformers
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import attnkit.hf

torch.set_num_threads(1)
torch.set_grad_enabled(False)
attnkit.hf.register()
config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=256)
calls: dict[str, list[int]] = {}


def timed(table, key: str, label: str) -> None:
    real = table[key]

    def call(*args, **kwargs):
        start = time.perf_counter_ns()
        result = real(*args, **kwargs)
        calls.setdefault(label, []).append(time.perf_counter_ns() - start)
        return result

    table[key] = call


for implementation in ("sdpa", "attnkit"):
    timed(ALL_ATTENTION_FUNCTIONS, implementation, f"attention function {implementation}")
    timed(ALL_MASK_ATTENTION_FUNCTIONS, implementation, f"mask function {implementation}")
models = {}
for implementation in ("sdpa", "attnkit"):
    torch.manual_seed(0)
    models[implementation] = transformers.LlamaForCausalLM._from_config(
        copy.deepcopy(config), attn_implementation=implementation).eval()
ids = torch.randint(0, 256, (1, 16))
out: dict[str, list[float]] = {}
for _round in range(3):
    for implementation, model in models.items():
        for _ in range(30):
            model(ids, use_cache=False)
        calls.clear()
        start = time.perf_counter()
        for _ in range(500):
            model(ids, use_cache=False)
        out.setdefault(f"forward {implementation}", []).append((time.perf_counter() - start) / 500 * 1e6)
        for label, times in calls.items():
            out.setdefault(label, []).append(statistics.median(times) / 1000)
for label, values in out.items():
    print(f"{label:32s} " + " ".join(f"{value:8.1f}" for value in values) + " us")
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1)
