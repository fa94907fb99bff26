"""Where the dense tiny call's microseconds go (B 1, H 4, L = S = 16, E 32, float32, one thread), built up a piece at a
time from SDPA and the NaN rule's one look inside a function with attention()'s signature (s0): the keyword checks
(s1), the autocast flag (s2), the shortcut's size and device questions (s3; s3a-c: SDPA's is_causal passed by
position, no is_compiling(), no is_causal at all), the rule's conditions (s4), and attention() itself (its frames).
One process, the forms alternating round by round; the best of 30 rounds of 3,000 calls each.

    .venv/bin/python benchmarks/results/overhead_ab_2026-11-28_fourteenth/pieces.py
"""
import importlib
import time

import torch
import torch.nn.functional as F

import attnkit
from attnkit.functional import nan
from attnkit.functional.attention import make_output

A = importlib.import_module("attnkit.functional.attention")
torch.set_num_threads(1)
q, k, v = (torch.randn(1, 4, 16, 32) for i in range(3))
sdpa = F.scaled_dot_product_attention
aa = torch._C._is_any_autocast_enabled
isc = torch.compiler.is_compiling
tr = torch._C._are_functorch_transforms_active
PB=("auto","sdpa")
def s0(q, k, v, *, mask=None, is_causal=False, causal_align="top-left", window=None, bias=None, scale=None, dropout_p=0.0, backend="auto", need_weights=False, score_mod=None, sinks=None, attn_mask=None, enable_gqa=None, return_lse=False, **unknown):
    output = sdpa(q, k, v)
    return make_output((output, None, None)) if output.equal(output) else None
def s1(q, k, v, *, mask=None, is_causal=False, causal_align="top-left", window=None, bias=None, scale=None, dropout_p=0.0, backend="auto", need_weights=False, score_mod=None, sinks=None, attn_mask=None, enable_gqa=None, return_lse=False, **unknown):
    if (mask is None and bias is None and window is None and scale is None and score_mod is None and sinks is None
            and attn_mask is None and enable_gqa is None and need_weights is False and dropout_p == 0 and not return_lse
            and not unknown and type(is_causal) is bool and backend in PB):
        output = sdpa(q, k, v)
        return make_output((output, None, None)) if output.equal(output) else None
def s2(q, k, v, *, mask=None, is_causal=False, causal_align="top-left", window=None, bias=None, scale=None, dropout_p=0.0, backend="auto", need_weights=False, score_mod=None, sinks=None, attn_mask=None, enable_gqa=None, return_lse=False, **unknown):
    if (mask is None and bias is None and window is None and scale is None and score_mod is None and sinks is None
            and attn_mask is None and enable_gqa is None and need_weights is False and dropout_p == 0 and not return_lse
            and not unknown and type(is_causal) is bool and backend in PB and not aa()):
        output = sdpa(q, k, v)
        return make_output((output, None, None)) if output.equal(output) else None
def s3(q, k, v, *, mask=None, is_causal=False, causal_align="top-left", window=None, bias=None, scale=None, dropout_p=0.0, backend="auto", need_weights=False, score_mod=None, sinks=None, attn_mask=None, enable_gqa=None, return_lse=False, **unknown):
    if (mask is None and bias is None and window is None and scale is None and score_mod is None and sinks is None
            and attn_mask is None and enable_gqa is None and need_weights is False and dropout_p == 0 and not return_lse
            and not unknown and type(is_causal) is bool and backend in PB and not aa()):
        kshape = k.shape
        if not q.is_cpu or isc() or kshape != v.shape:
            return None
        B, H, L, E = q.shape
        Bk, Hk, S, Ek = kshape
        if B != Bk or H != Hk or E != Ek or not (B and H and L and S and E):
            return None
        output = sdpa(q, k, v, is_causal=is_causal)
        return make_output((output, None, None)) if output.equal(output) else None
def s4(q, k, v, *, mask=None, is_causal=False, causal_align="top-left", window=None, bias=None, scale=None, dropout_p=0.0, backend="auto", need_weights=False, score_mod=None, sinks=None, attn_mask=None, enable_gqa=None, return_lse=False, **unknown):
    if (mask is None and bias is None and window is None and scale is None and score_mod is None and sinks is None
            and attn_mask is None and enable_gqa is None and need_weights is False and dropout_p == 0 and not return_lse
            and not unknown and type(is_causal) is bool and backend in PB and not aa()):
        kshape = k.shape
        if not q.is_cpu or isc() or kshape != v.shape:
            return None
        B, H, L, E = q.shape
        Bk, Hk, S, Ek = kshape
        if B != Bk or H != Hk or E != Ek or not (B and H and L and S and E):
            return None
        output = sdpa(q, k, v, is_causal=is_causal)
        if nan._on and not tr() and (not is_causal or L >= S) and S >= nan._MIN_KEYS.get(output.dtype, 64) and output.equal(output):
            return make_output((output, None, None))
def s3a(q, k, v, *, mask=None, is_causal=False, causal_align="top-left", window=None, bias=None, scale=None, dropout_p=0.0, backend="auto", need_weights=False, score_mod=None, sinks=None, attn_mask=None, enable_gqa=None, return_lse=False, **unknown):
    if (mask is None and bias is None and window is None and scale is None and score_mod is None and sinks is None
            and attn_mask is None and enable_gqa is None and need_weights is False and dropout_p == 0 and not return_lse
            and not unknown and type(is_causal) is bool and backend in PB and not aa()):
        kshape = k.shape
        if not q.is_cpu or isc() or kshape != v.shape:
            return None
        B, H, L, E = q.shape
        Bk, Hk, S, Ek = kshape
        if B != Bk or H != Hk or E != Ek or not (B and H and L and S and E):
            return None
        output = sdpa(q, k, v, None, 0.0, is_causal)
        return make_output((output, None, None)) if output.equal(output) else None
def s3b(q, k, v, *, mask=None, is_causal=False, causal_align="top-left", window=None, bias=None, scale=None, dropout_p=0.0, backend="auto", need_weights=False, score_mod=None, sinks=None, attn_mask=None, enable_gqa=None, return_lse=False, **unknown):
    if (mask is None and bias is None and window is None and scale is None and score_mod is None and sinks is None
            and attn_mask is None and enable_gqa is None and need_weights is False and dropout_p == 0 and not return_lse
            and not unknown and type(is_causal) is bool and backend in PB and not aa()):
        kshape = k.shape
        if not q.is_cpu or kshape != v.shape:
            return None
        B, H, L, E = q.shape
        Bk, Hk, S, Ek = kshape
        if B != Bk or H != Hk or E != Ek or not (B and H and L and S and E):
            return None
        output = sdpa(q, k, v, is_causal=is_causal)
        return make_output((output, None, None)) if output.equal(output) else None
def s3c(q, k, v, *, mask=None, is_causal=False, causal_align="top-left", window=None, bias=None, scale=None, dropout_p=0.0, backend="auto", need_weights=False, score_mod=None, sinks=None, attn_mask=None, enable_gqa=None, return_lse=False, **unknown):
    if (mask is None and bias is None and window is None and scale is None and score_mod is None and sinks is None
            and attn_mask is None and enable_gqa is None and need_weights is False and dropout_p == 0 and not return_lse
            and not unknown and type(is_causal) is bool and backend in PB and not aa()):
        kshape = k.shape
        if not q.is_cpu or isc() or kshape != v.shape:
            return None
        B, H, L, E = q.shape
        Bk, Hk, S, Ek = kshape
        if B != Bk or H != Hk or E != Ek or not (B and H and L and S and E):
            return None
        output = sdpa(q, k, v)
        return make_output((output, None, None)) if output.equal(output) else None
FORMS = {"sdpa": lambda: sdpa(q,k,v), "s0 sig+look": lambda: s0(q,k,v).output, "s1 +kwargs": lambda: s1(q,k,v).output,
  "s2 +autocast": lambda: s2(q,k,v).output, "s3 +shapes": lambda: s3(q,k,v).output, "s3a positional": lambda: s3a(q,k,v).output, "s3b no isc": lambda: s3b(q,k,v).output, "s3c no kwarg": lambda: s3c(q,k,v).output, "s4 +rule conds": lambda: s4(q,k,v).output,
  "attention": lambda: attnkit.attention(q,k,v).output}
times = {name: [] for name in FORMS}
for _ in range(30):
    for name, form in FORMS.items():
        start = time.perf_counter()
        for _ in range(3000):
            form()
        times[name].append((time.perf_counter() - start) / 3000 * 1e6)
base = min(times["sdpa"])
print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, one thread; best of 30 rounds")
for name, values in times.items():
    print(f"{name:25s} {min(values):6.2f} us  {min(values) / base:.2f}x")
