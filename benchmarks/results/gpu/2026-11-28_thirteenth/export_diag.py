"""Why torch.export with dynamic lengths failed on CUDA (torch 2.11) where it passes on the CPU (torch 2.13): each
variant exported with L and S as symbols over [2, 4096], pass or fail, the guards that failed, and the lines torch's
shape environment logs when it adds a guard (the frame that asked). Pure-torch variants first: is it PyTorch's?

    PYTHONPATH=src python3 benchmarks/results/gpu/2026-11-28_thirteenth/export_diag.py DEVICE > OUT.txt 2>&1
"""
import io
import logging
import math
import sys

import torch
import torch.nn.functional as F
from torch.export import Dim

import attnkit
from attnkit.functional import nan

device = sys.argv[1]


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, q, k, v):
        return self.fn(q, k, v)


def rows(q, k, v, out):
    B, H, L, _ = q.shape
    Hkv = k.shape[1]
    kv = torch.maximum(k.amax(dim=(2, 3)), v.amax(dim=(2, 3)))
    poisoned = torch.isnan(torch.maximum(q.amax(-1, keepdim=True).view(B, Hkv, H // Hkv, L, 1),
                                         kv.view(B, Hkv, 1, 1, 1))).view(B, H, L, 1)
    return torch.where(poisoned, math.nan, out)


def rep(x):
    return x.repeat_interleave(2, dim=1)


VARIANTS = {
    "torch sdpa gqa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
    "torch sdpa repeated": lambda q, k, v: F.scaled_dot_product_attention(q, rep(k), rep(v)),
    "torch sdpa gqa + rows": lambda q, k, v: rows(q, k, v, F.scaled_dot_product_attention(q, k, v, enable_gqa=True)),
    "torch sdpa gqa + rows, contiguous": lambda q, k, v: rows(
        q, k, v, F.scaled_dot_product_attention(q, k, v, enable_gqa=True).contiguous()),
    "torch sdpa repeated + rows": lambda q, k, v: rows(q, k, v, F.scaled_dot_product_attention(q, rep(k), rep(v))),
    "attnkit": lambda q, k, v: attnkit.attention(q, k, v).output,
    "attnkit reference": lambda q, k, v: attnkit.attention(q, k, v, backend="reference").output,
    "attnkit causal": lambda q, k, v: attnkit.attention(q, k, v, is_causal=True).output,
}


def run(name, fn, dtype):
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    logger = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    logger.addHandler(handler)
    torch._logging.set_logs(dynamic=logging.INFO)
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(2, 4, 9, 32, device=device, dtype=dtype, generator=g)
    k, v = (torch.randn(2, 2, 11, 32, device=device, dtype=dtype, generator=g) for _ in range(2))
    L, S = Dim("L", min=2, max=4096), Dim("S", min=2, max=4096)
    try:
        program = torch.export.export(Fn(fn), (q, k, v), dynamic_shapes=[{2: L}, {2: S}, {2: S}], strict=False)
        q2, k2, v2 = (torch.randn(2, x.shape[1], n, 32, device=device, dtype=dtype, generator=g)
                      for x, n in ((q, 40), (k, 45), (v, 45)))
        got, want = program.module()(q2, k2, v2), fn(q2, k2, v2)
        verdict = f"ok, max diff at L=40 {float((got.float() - want.float()).abs().max()):.2e}"
    except Exception as error:  # the record wants every failure's text
        verdict = "FAIL " + type(error).__name__ + ": " + "\n    ".join(
            line for line in str(error).splitlines() if "Not all values" in line or "Constraints" in line)[:1500]
    finally:
        logger.removeHandler(handler)
        torch._logging.set_logs()
    added = [line for line in log.getvalue().splitlines() if "guard added" in line or "Min(" in line][:12]
    print(f"== {name}, {dtype}: {verdict}")
    for line in added:
        print("    guard:", line[:400])
    sys.stdout.flush()


print("torch", torch.__version__, "device", device, torch.cuda.get_device_name() if device == "cuda" else "")
for dtype in (torch.float32, torch.bfloat16):
    for name, fn in VARIANTS.items():
        run(name, fn, dtype)
with nan.nan_rule(False):
    run("attnkit, nan_rule(False)", VARIANTS["attnkit"], torch.float32)
