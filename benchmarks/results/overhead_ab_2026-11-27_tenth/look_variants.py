"""The NaN rule's look in other forms, inside real calls: the look stood in for by each form (and by nothing),
the variants alternating round by round; the best (MultiHeadAttention) or median (transformers) of the rounds.

    PYTHONPATH=src python benchmarks/results/overhead_ab_2026-11-27_tenth/look_variants.py mha   # masked layer call
    PYTHONPATH=src python benchmarks/results/overhead_ab_2026-11-27_tenth/look_variants.py hf    # a Llama layer's call

``mha``: benchmarks/overhead.py's MultiHeadAttention (D 128, H 4, L 16) with a (B, 1, 1, S) mask, 15 rounds of
3,000 calls, ``nan.masked_output`` replaced. ``hf``: a tiny Llama (4 layers, hidden 128) through the transformers
bridge, 16 tokens, 24 rounds of 60 forwards, the registered attention function's median call per round,
``nan.plain_output`` replaced. Every form is a whole-tensor reduction and one host read; each raises if it sees a
NaN (none is there), so none is skipped.
"""

from __future__ import annotations

import copy
import math
import statistics
import sys
import time
import timeit

import numpy as np
import torch
import torch.nn.functional as F

import attnkit

torch.set_num_threads(1)
torch.set_grad_enabled(False)
nan = sys.modules["attnkit.functional.nan"]


def flat(output):
    return output.as_strided((output.numel(),), (1,))  # (SDPA's fresh output: dense, in some order)


LOOKS = {
    "amax().item()": lambda o: o.amax().item(),
    "max().item()": lambda o: o.max().item(),
    "sum().item()": lambda o: o.sum().item(),
    "torch.dot (BLAS)": lambda o: torch.dot(f := flat(o), f).item(),
    "F.linear 1 x n (BLAS)": lambda o: F.linear(f := flat(o).view(1, -1), f).item(),
    "NumPy dot": lambda o: float(np.dot(a := o.numpy().ravel(), a)),
}


def stand_in(look, arguments: int):
    def looked(*args):
        output = args[-1] if arguments == 5 else args[-2]
        if math.isnan(look(output)):
            raise RuntimeError("a NaN where there is none")
        return output
    return looked


def mha() -> dict[str, float]:
    layer = attnkit.MultiHeadAttention(128, 4).eval()
    x = torch.randn(1, 16, 128)
    mask = torch.ones(1, 1, 1, 16, dtype=torch.bool)
    mask[..., -3:] = False
    variants = {"as is": nan.masked_output, "nothing": lambda q, k, v, dims, output: output,
                **{name: stand_in(look, 5) for name, look in LOOKS.items()}}
    rounds: dict[str, list[float]] = {name: [] for name in variants}
    call = lambda: layer(x, mask=mask)  # noqa: E731
    for _ in range(300):
        call()
    items = list(variants.items())
    for r in range(15):
        for name, fn in items[r % len(items):] + items[:r % len(items)]:
            nan.masked_output = fn
            rounds[name].append(timeit.timeit(call, number=3000) / 3000 * 1e6)
    return {name: min(times) for name, times in rounds.items()}


def hf() -> dict[str, float]:
    import transformers
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    import attnkit.hf

    attnkit.hf.register()
    calls: list[int] = []
    real = ALL_ATTENTION_FUNCTIONS["attnkit"]

    def timed(*args, **kwargs):
        start = time.perf_counter_ns()
        result = real(*args, **kwargs)
        calls.append(time.perf_counter_ns() - start)
        return result

    ALL_ATTENTION_FUNCTIONS["attnkit"] = timed
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=256)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(copy.deepcopy(config), attn_implementation="attnkit").eval()
    ids = torch.randint(0, 256, (1, 16))
    variants = {"as is": nan.plain_output, "nothing": lambda q, k, v, dims, output, causal: output,
                **{name: stand_in(look, 6) for name, look in LOOKS.items()}}
    rounds: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(30):
        model(ids, use_cache=False)
    items = list(variants.items())
    for r in range(24):
        for name, fn in items[r % len(items):] + items[:r % len(items)]:
            nan.plain_output = fn
            calls.clear()
            for _ in range(60):
                model(ids, use_cache=False)
            rounds[name].append(statistics.median(calls) / 1000)
    return {name: statistics.median(times) for name, times in rounds.items()}


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "mha"
    result = mha() if which == "mha" else hf()
    base = result["as is"]
    print(f"{'the look as':28s} {'us':>8s} {'vs as is':>9s}   ({which}: "
          f"{'best round' if which == 'mha' else 'median of the rounds medians'})")
    for name, us in result.items():
        print(f"{name:28s} {us:8.1f} {us - base:+9.1f}")
