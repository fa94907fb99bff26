"""Today's linear attention on CUDA (marker ``gpu``): the gated delta rule's chunked form on the GPU against the
float64 recurrence on the CPU (itself equal to the NumPy oracle of tests/functional/test_delta_rule.py), against
flash-linear-attention's Triton kernel where fla-core is installed, and the Gated DeltaNet layer's
constant-size cache decoding on the GPU as one whole pass."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from attnkit.functional.linear import gated_delta_rule
from attnkit.layers import GatedDeltaNet, LinearStateCache

CUDA = "cuda"
TOLERANCES = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def _inputs(decay: str, B=2, Hk=2, H=4, L=150, K=32, V=24, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q, k = (torch.nn.functional.normalize(torch.randn(B, Hk, L, K, generator=generator, dtype=torch.float64), dim=-1)
            for _ in range(2))
    v = torch.randn(B, H, L, V, generator=generator, dtype=torch.float64)
    beta = torch.rand(B, H, L, generator=generator, dtype=torch.float64)
    g = {"none": None, "per-head": -0.3 * torch.rand(B, H, L, generator=generator, dtype=torch.float64),
         "per-channel": -0.3 * torch.rand(B, H, L, K, generator=generator, dtype=torch.float64)}[decay]
    return q, k, v, g, beta


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double().cpu() - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("decay", ["none", "per-head", "per-channel"])
def test_the_chunked_rule_on_cuda_equals_the_float64_recurrence(decay, dtype):
    q, k, v, g, beta = _inputs(decay)
    want = gated_delta_rule(q, k, v, g, beta, chunk_size=1, output_final_state=True)

    def cuda(x):
        return None if x is None else x.to(CUDA, dtype)

    got = gated_delta_rule(cuda(q), cuda(k), cuda(v), None if g is None else g.to(CUDA), cuda(beta), chunk_size=64,
                           output_final_state=True)
    assert got.output.device.type == CUDA and got.output.dtype == dtype
    assert got.final_state.dtype == torch.float32  # the state is kept in float32, as the models keep it
    assert _relative(got.output, want.output) < TOLERANCES[dtype]
    assert _relative(got.final_state, want.final_state) < TOLERANCES[dtype]


def test_the_rule_equals_flash_linear_attentions_kernel():
    if importlib.util.find_spec("fla") is None:
        pytest.skip("fla-core is not installed (scripts/gpu_record.sh carries its wheel in .whl/)")
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    q, k, v, g, beta = _inputs("per-head", Hk=4, L=300, K=64, V=64)  # fla: as many key heads as value heads

    def fla_layout(x, dtype=torch.bfloat16):
        return x.transpose(1, 2).contiguous().to(CUDA, dtype)

    theirs, their_state = chunk_gated_delta_rule(fla_layout(q), fla_layout(k), fla_layout(v),
                                                 fla_layout(g, torch.float32), fla_layout(beta),
                                                 output_final_state=True)
    bf16 = [x.to(torch.bfloat16).double() for x in (q, k, v, beta)]  # the same rounded inputs, in float64
    want = gated_delta_rule(bf16[0], bf16[1], bf16[2], g.float().double(), bf16[3], output_final_state=True)
    assert _relative(theirs.transpose(1, 2), want.output) < 2e-2
    assert _relative(their_state, want.final_state) < 2e-2


def test_the_gated_deltanet_layer_decodes_on_cuda_as_one_whole_pass():
    torch.manual_seed(0)
    layer = GatedDeltaNet(64, 2, 4, 16, 16, conv_kernel=4).to(CUDA).eval()
    x = torch.randn(2, 40, 64, device=CUDA)
    with torch.no_grad():
        whole = layer(x).output
        cache, outputs, start = LinearStateCache(), [], 0
        for size in [17, 1, 1, 5, 16]:
            outputs.append(layer(x[:, start:start + size], cache=cache).output)
            start += size
    assert cache.position == 40
    torch.testing.assert_close(torch.cat(outputs, dim=1), whole, rtol=1e-4, atol=1e-4)
