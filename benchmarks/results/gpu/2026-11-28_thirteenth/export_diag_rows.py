"""Which form of the NaN rule's rows exports with dynamic lengths on torch 2.11 (export_diag.py found the rows' views
after a broadcast add guards over Min(L, 2 L) there, where torch 2.13 adds none). Each form is exported after SDPA
(pure torch) and inside attnkit.attention (nan.poisoned_rows replaced by the form), on DEVICE, float32 and bf16,
grouped (Hkv 2) and not; every exported program is checked against the form's eager rows with NaNs planted.

    PYTHONPATH=src python3 benchmarks/results/gpu/2026-11-28_thirteenth/export_diag_rows.py DEVICE
"""
import math
import sys

import torch
import torch.nn.functional as F
from torch.export import Dim

import attnkit
from attnkit.functional import nan

device = sys.argv[1]


def current(q, k, v, dims):
    B, H, L = q.shape[0], q.shape[1], q.shape[2]
    Hkv = k.shape[1]
    kv = torch.maximum(k.amax(dim=(2, 3)), v.amax(dim=(2, 3)))
    return torch.isnan(torch.maximum(q.amax(-1, keepdim=True).view(B, Hkv, H // Hkv, L, 1),
                                     kv.view(B, Hkv, 1, 1, 1))).view(B, H, L, 1)


def flat_then_unsqueeze(q, k, v, dims):  # (B, H, L) throughout, the keys' maxima repeated per query head
    H, Hkv = q.shape[1], k.shape[1]
    kv = torch.maximum(k.amax(dim=(2, 3)), v.amax(dim=(2, 3)))
    kv = kv.repeat_interleave(H // Hkv, dim=1) if H != Hkv else kv
    return torch.isnan(torch.maximum(q.amax(-1), kv.unsqueeze(-1))).unsqueeze(-1)


def keepdim_repeat(q, k, v, dims):  # (B, H, L, 1) against (B, H, 1, 1), no view after the broadcast
    H, Hkv = q.shape[1], k.shape[1]
    kv = torch.maximum(k.amax(dim=(2, 3), keepdim=True), v.amax(dim=(2, 3), keepdim=True))
    kv = kv.repeat_interleave(H // Hkv, dim=1) if H != Hkv else kv
    return torch.isnan(torch.maximum(q.amax(-1, keepdim=True), kv))


def flat_view_unsqueeze(q, k, v, dims):  # the current views without keepdim: (B, Hkv, G, L) then (B, H, L), 1
    B, H, L = q.shape[0], q.shape[1], q.shape[2]
    Hkv = k.shape[1]
    kv = torch.maximum(k.amax(dim=(2, 3)), v.amax(dim=(2, 3)))
    m = torch.maximum(q.amax(-1).view(B, Hkv, H // Hkv, L), kv.view(B, Hkv, 1, 1))
    return torch.isnan(m).reshape(B, H, L).unsqueeze(-1)


FORMS = {"current": current, "flat, repeated, unsqueeze": flat_then_unsqueeze, "keepdim, repeated": keepdim_repeat,
         "flat views, unsqueeze": flat_view_unsqueeze}


class Pure(torch.nn.Module):
    def __init__(self, form):
        super().__init__()
        self.form = form

    def forward(self, q, k, v):
        out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return torch.where(self.form(q, k, v, None), math.nan, out)


class Kit(torch.nn.Module):
    def forward(self, q, k, v):
        return attnkit.attention(q, k, v).output


def inputs(Hkv, L, S, dtype, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(2, 4, L, 32, device=device, dtype=dtype, generator=g)
    k, v = (torch.randn(2, Hkv, S, 32, device=device, dtype=dtype, generator=g) for _ in range(2))
    q[0, 1, L // 2, 3] = math.nan
    k[1, 0, S - 1, 0] = math.nan
    return q, k, v


def attempt(module, Hkv, dtype):
    L, S = Dim("L", min=2, max=4096), Dim("S", min=2, max=4096)
    try:
        program = torch.export.export(module, inputs(Hkv, 9, 11, dtype, 0), dynamic_shapes=[{2: L}, {2: S}, {2: S}],
                                      strict=False)
        args = inputs(Hkv, 40, 45, dtype, 1)
        got, want = program.module()(*args), module(*args)
        same = torch.equal(got.isnan(), want.isnan()) and bool(got.isnan().any())
        return f"ok, rows {'equal' if same else 'DIFFER'}"
    except Exception as error:
        return "FAIL " + type(error).__name__ + " " + " | ".join(
            line.strip()[:160] for line in str(error).splitlines() if "Not all values" in line)[:600]


print("torch", torch.__version__, device)
real = nan.poisoned_rows
for dtype in (torch.float32, torch.bfloat16):
    for Hkv in (2, 4):
        for name, form in FORMS.items():
            print(f"== {name}, {dtype}, Hkv {Hkv}, pure: {attempt(Pure(form), Hkv, dtype)}")
            nan.poisoned_rows = lambda q, k, v, dims, form=form: form(q, k, v, dims)
            try:
                print(f"== {name}, {dtype}, Hkv {Hkv}, attnkit: {attempt(Kit(), Hkv, dtype)}")
            finally:
                nan.poisoned_rows = real
            sys.stdout.flush()
