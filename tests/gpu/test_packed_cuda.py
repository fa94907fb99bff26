"""MultiHeadAttention's packed q/k/v projection on CUDA (marker ``gpu``): a layer moved to the GPU stays packed,
makes one projection call for q, k and v where no weight gradient is wanted, and gives the numbers of the three
projections called one by one (cuBLAS may choose another algorithm for the wider matrix: compared within the
dtype's tolerance) and of the float64 layer on the CPU. Writes to a weight on the GPU are seen."""

from __future__ import annotations

import copy

import pytest
import torch

from attnkit import MultiHeadAttention
from attnkit.layers import FixedKVCache, KVCache, RotaryEmbedding

from helpers import matmuls, separately

TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2}
DTYPES = list(TOLERANCE)


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str):
    scale = want.abs().max().clamp(min=1.0)
    error = (got.double().cpu() - want.double().cpu()).abs().max() / scale
    assert error <= TOLERANCE[dtype], f"{what}: relative error {float(error):.3g} over {TOLERANCE[dtype]}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rotary", [False, True], ids=["plain", "rotary"])
@pytest.mark.parametrize("num_kv_heads", [8, 2, 1], ids=["mha", "gqa", "mqa"])
def test_a_layer_moved_to_cuda_projects_once_and_gives_the_same_numbers(num_kv_heads, rotary, dtype):
    torch.manual_seed(0)
    cpu = MultiHeadAttention(256, 8, num_kv_heads, rotary=RotaryEmbedding(32) if rotary else None).eval()
    gpu = copy.deepcopy(cpu).to("cuda", dtype)
    packed = gpu._packed_qkv
    assert packed is not None and packed.weight.is_cuda and packed.weight.dtype == dtype
    assert packed.holds((gpu.q_proj, gpu.k_proj, gpu.v_proj))
    x = torch.randn(2, 300, 256, dtype=torch.float64)
    want = cpu.double()(x, is_causal=True).output.detach()
    xg = x.to("cuda", dtype)
    with torch.no_grad():
        assert matmuls(lambda: gpu(xg, is_causal=True)) == 2
        got = gpu(xg, is_causal=True).output
    _close(got, separately(gpu, xg, is_causal=True), dtype, "packed against one by one")
    _close(got, want, dtype, "packed on CUDA against float64 on the CPU")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("make_cache", [KVCache, lambda: FixedKVCache(64)], ids=["KVCache", "FixedKVCache"])
def test_decoding_on_cuda_with_the_packed_projection_equals_the_full_forward(make_cache, dtype):
    torch.manual_seed(0)
    cpu = MultiHeadAttention(128, 8, 2, rotary=RotaryEmbedding(16)).eval()
    gpu = copy.deepcopy(cpu).to("cuda", dtype)
    x = torch.randn(1, 40, 128, dtype=torch.float64)
    want = cpu.double()(x, is_causal=True).output.detach()
    xg, cache = x.to("cuda", dtype), make_cache()
    with torch.no_grad():
        steps = [gpu(xg[:, :32], is_causal=True, cache=cache).output]
        steps += [gpu(xg[:, i : i + 1], is_causal=True, cache=cache).output for i in range(32, 40)]
        assert matmuls(lambda: gpu(xg[:, :1], is_causal=True, cache=make_cache())) == 2
    _close(torch.cat(steps, dim=1), want, dtype, "decoded with the packed projection against float64")


def test_a_write_to_a_weight_on_cuda_is_seen_by_the_packed_call():
    torch.manual_seed(0)
    layer = MultiHeadAttention(128, 4).to("cuda").eval()
    x = torch.randn(2, 50, 128, device="cuda")
    with torch.no_grad():
        before = layer(x).output
        layer.k_proj.weight.mul_(2)  # in place, on the packed memory
        layer.v_proj.weight.data.add_(1)  # through .data, which the version counter misses
        assert matmuls(lambda: layer(x)) == 2
        got = layer(x).output
    assert not torch.allclose(got, before)
    _close(got, separately(layer, x), torch.float32, "after the writes")
