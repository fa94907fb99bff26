"""How low the dense tiny call (B 1, H 4, L = S = 16, E 32, float32, one thread) can go with the NaN rule's one look:
SDPA alone, SDPA and the look with no Python function around them, a function with attention()'s signature that
does only that (no check, no question), the same without the look, and attention() itself. One process, the forms
alternating round by round; the best of 30 rounds of 3,000 calls each.

    .venv/bin/python benchmarks/results/overhead_ab_2026-11-28_fourteenth/floor.py
"""

import time

import torch
import torch.nn.functional as F

import attnkit
from attnkit.functional.attention import make_output

torch.set_num_threads(1)
q, k, v = (torch.randn(1, 4, 16, 32, generator=torch.Generator().manual_seed(i)) for i in range(3))
sdpa = F.scaled_dot_product_attention


def bare_look(q, k, v):
    output = sdpa(q, k, v)
    return output if output.equal(output) else None


def signature_and_look(q, k, v, *, mask=None, is_causal=False, causal_align="top-left", window=None, bias=None,
                       scale=None, dropout_p=0.0, backend="auto", need_weights=False, score_mod=None, sinks=None,
                       attn_mask=None, enable_gqa=None, return_lse=False, **unknown):
    output = sdpa(q, k, v)
    return make_output((output, None, None)) if output.equal(output) else None


def signature_only(q, k, v, *, mask=None, is_causal=False, causal_align="top-left", window=None, bias=None,
                   scale=None, dropout_p=0.0, backend="auto", need_weights=False, score_mod=None, sinks=None,
                   attn_mask=None, enable_gqa=None, return_lse=False, **unknown):
    return make_output((sdpa(q, k, v), None, None))


FORMS = {
    "SDPA": lambda: sdpa(q, k, v),
    "SDPA + the look, no function": lambda: bare_look(q, k, v),
    "attention()'s signature, SDPA, no look": lambda: signature_only(q, k, v).output,
    "attention()'s signature, SDPA + the look": lambda: signature_and_look(q, k, v).output,
    "attnkit.attention": lambda: attnkit.attention(q, k, v).output,
}
times: dict[str, list[float]] = {name: [] for name in FORMS}
for _ in range(30):
    for name, form in FORMS.items():
        start = time.perf_counter()
        for _ in range(3000):
            form()
        times[name].append((time.perf_counter() - start) / 3000 * 1e6)
base = min(times["SDPA"])
print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, one thread; best of 30 rounds")
for name, values in times.items():
    print(f"{name:45s} {min(values):6.2f} us  {min(values) / base:.2f}x")
