"""Jagged nested q, k and v on CUDA (marker ``gpu``; skipped with the reason on a machine without one): attention()
against torch's own SDPA over the same nested tensors (its flash kernel takes them on CUDA) and, causal, against
each sequence alone; gradients reach the nested leaves."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnkit

LENGTHS = [37, 5, 128, 64]


def _jagged(lengths, H, E, dtype, generator):
    parts = [torch.randn(n, H, E, generator=generator).to("cuda", dtype) for n in lengths]
    leaf = torch.nested.nested_tensor(parts, layout=torch.jagged, requires_grad=True)
    return leaf, leaf.transpose(1, 2), parts


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_nested_calls_on_cuda_match_torch_and_each_sequence_alone(dtype):
    generator = torch.Generator().manual_seed(3)
    (ql, q, qs), (_, k, ks), (_, v, vs) = (_jagged(LENGTHS, 4, 64, dtype, generator) for _ in range(3))
    tolerance = dict(rtol=2e-2, atol=2e-2) if dtype != torch.float32 else dict(rtol=1e-4, atol=1e-4)
    got = attnkit.attention(q, k, v).output
    assert got.is_cuda and got.offsets() is q.offsets()
    for a, b in zip(got.unbind(), F.scaled_dot_product_attention(q, k, v).unbind()):
        torch.testing.assert_close(a, b, **tolerance)
    causal = attnkit.attention(q, k, v, is_causal=True).output
    for a, x, y, z in zip(causal.unbind(), qs, ks, vs):
        want = F.scaled_dot_product_attention(*(t.transpose(0, 1).float() for t in (x, y, z)), is_causal=True)
        torch.testing.assert_close(a.float(), want, **tolerance)
    causal.values().float().square().sum().backward()
    assert ql.grad is not None and ql.grad.values().isfinite().all()
