"""Context parallelism on one CUDA GPU (marker ``gpu``): the ring's step-and-merge on CUDA against
one-process attention, and the ranks' agreement check over NCCL (which takes CUDA tensors only).
The multi-process tests stay on gloo (tests/test_distributed.py)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import attnkit
from attnkit import distributed
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
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 8, 512, 64, device="cuda", dtype=torch.float64) for _ in range(3))
    k, v = k[:, :2], v[:, :2]  # GQA 4
    want = attnkit.attention(q, k, v, backend="reference", **kwargs).output
    qs, ks, vs = (x.to(dtype).requires_grad_() for x in (q, k, v))
    got = distributed.context_parallel_attention(qs, ks, vs, layout="contiguous", **kwargs)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), want, rtol=tolerance, atol=tolerance)
    got.sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (qs, ks, vs))


def test_agreement_check_runs_over_nccl(nccl_world_of_one):
    signature = {"batch": 2, "window": None, "dtype": torch.bfloat16}
    distributed._check_agreement(nccl_world_of_one, 1, 0, signature, torch.device("cuda"))
