"""Context parallelism on one CUDA GPU (marker ``gpu``): the ring's step-and-merge on CUDA against
one-process attention, and the ranks' agreement check over NCCL (which takes CUDA tensors only).
The multi-process tests stay on gloo (tests/test_distributed.py)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import attnkit
from attnkit import distributed
from attnkit.distributed import group

from helpers import free_port


@pytest.fixture
def nccl_world_of_one():
    if not dist.is_nccl_available():
        pytest.skip("this PyTorch has no NCCL")
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", world_size=1, rank=0)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"is_causal": True, "window": 100}])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_ring_step_and_merge_on_cuda_equals_attention(kwargs, dtype):
    """The one-process ring on CUDA, forward and gradients, against float64 autograd: bf16 blocks
    without a mask (full, the causal diagonal) on the flash kernel, the window's on the
    memory-efficient one with a bias, float32 on the memory-efficient one."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 8, 512, 64, device="cuda", dtype=torch.float64) for _ in range(3))
    k, v = k[:, :2], v[:, :2]  # GQA 4
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    want = attnkit.attention(q, k, v, backend="reference", **kwargs).output
    d_out = torch.randn_like(want)
    want_grads = torch.autograd.grad(want, (q, k, v), d_out)
    qs, ks, vs = (x.detach().to(dtype).requires_grad_() for x in (q, k, v))
    got = distributed.context_parallel_attention(qs, ks, vs, layout="contiguous", **kwargs).output
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), want.detach(), rtol=tolerance, atol=tolerance)
    grads = torch.autograd.grad(got, (qs, ks, vs), d_out.to(dtype))
    for name, g, w in zip("qkv", grads, want_grads):  # dk, dv sum over 4 query heads and 512 queries
        torch.testing.assert_close(g.double(), w, rtol=5 * tolerance, atol=5 * tolerance,
                                   msg=lambda m, name=name: f"d{name}: {m}")


def test_agreement_check_runs_over_nccl(nccl_world_of_one):
    signature = {"batch": 2, "window": None, "dtype": torch.bfloat16}
    group.check_agreement(nccl_world_of_one, 1, 0, signature, torch.device("cuda"))


@pytest.mark.parametrize("biased", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("lengths", [(100, 77), (128, 256)], ids=["unaligned", "aligned"])
def test_partial_attention_on_the_cuda_kernels(dtype, lengths, biased):
    """The ring's block kernels on CUDA (the memory-efficient op with bias rows padded to 16 and
    its log-sum-exp padded to 32; the flash op for bf16 parts without a bias): parts merged equal
    float64 attention, empty rows give 0 and -inf, and the parts' gradients add up to float64
    autograd's."""
    from attnkit.functional.partial import (
        _cuda_flash,
        fused,
        merge_partial,
        partial_attention,
        partial_attention_backward,
    )

    Lq, S = lengths
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, n, 64, device="cuda", dtype=torch.float64) for n in (Lq, S, S))
    ok = (torch.rand(Lq, S, device="cuda") > 0.3)[None, None] & (torch.rand(2, S, device="cuda") > 0.1)[:, None, None]
    ok[:, :, 3] = False
    if not biased:
        ok = torch.ones_like(ok)
    x = [t.to(dtype) for t in (q, k, v)]
    tol = 2e-5 if dtype == torch.float32 else 3e-2
    assert fused(x[0]) == "cuda"
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    reference = attnkit.attention(q, k, v, mask=ok, scale=0.125, backend="reference")
    want = reference.output
    d_out = torch.randn_like(want)
    grads = torch.autograd.grad(want, (q, k, v), d_out)
    out = torch.zeros(2, 4, Lq, 64, device="cuda")
    lse = torch.full((2, 4, Lq), float("-inf"), device="cuda")
    cuts = [(0, S // 2), (S // 2, S)]
    bias = torch.zeros(ok.shape, dtype=dtype, device="cuda").masked_fill(~ok, float("-inf"))
    part_bias = [bias[..., a:b].contiguous() if biased else None for a, b in cuts]
    assert _cuda_flash(x[0], x[1], x[2], part_bias[0], False) == (dtype == torch.bfloat16 and not biased)
    for (a, b), part in zip(cuts, part_bias):
        out, lse = merge_partial(out, lse, *partial_attention(x[0], x[1][:, :, a:b], x[2][:, :, a:b], 0.125, part))
    torch.testing.assert_close(out.double(), want.detach(), rtol=tol, atol=tol)
    finite = torch.isfinite(reference.lse)
    torch.testing.assert_close(lse[finite].double(), reference.lse[finite].detach(), rtol=tol, atol=tol)  # natural log
    if biased:
        assert torch.isneginf(lse[:, :, 3]).all() and (out[:, :, 3] == 0).all()
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    parts = [partial_attention_backward(d_out.to(dtype), x[0], x[1][:, :, a:b], x[2][:, :, a:b], out, safe, 0.125,
                                        part) for (a, b), part in zip(cuts, part_bias)]
    got = (sum(p[0].double() for p in parts), torch.cat([p[1].double() for p in parts], 2),
           torch.cat([p[2].double() for p in parts], 2))
    for name, g, w in zip("qkv", got, grads):
        torch.testing.assert_close(g, w, rtol=10 * tol, atol=10 * tol, msg=lambda m, name=name: f"d{name}: {m}")
