"""The HF bridge's per-call pieces this session changed, each alone in a loop (best of five repeats of 50,000
calls): run with the base revision's src and with this session's, side by side.

    PYTHONPATH=src python benchmarks/results/overhead_ab_2026-11-27_tenth/hf_bridge/pieces_alone.py
"""

import timeit

import torch
import transformers

import attnkit.hf.interface as interface
from attnkit.hf.keywords import check_keywords


def best_us(fn) -> float:
    return min(timeit.repeat(fn, number=50_000, repeat=5)) / 50_000 * 1e6


module = torch.nn.Module()
module.config = transformers.LlamaConfig()
keywords = {"position_ids": None, "cache_position": None, "past_key_values": None}
for name, fn in {
    "_check_module(a Llama attention module)": lambda: interface._check_module(module),
    "check_keywords(three ignored keywords)": lambda: check_keywords("LlamaAttention", keywords),
    "_selection(no indices)": lambda: interface._selection(module, keywords, 4, 16),
    "weights_requested(no output_attentions)": lambda: interface.weights_requested(keywords),
}.items():
    print(f"{name:45s} {best_us(fn):6.3f} us")
