"""Today's linear attention on CUDA (marker ``gpu``): the gated delta rule's chunked form on the GPU against the
float64 recurrence on the CPU (itself equal to the NumPy oracle of tests/functional/test_delta_rule.py), against
flash-linear-attention's Triton kernel where fla-core is installed, the dispatch to fla's kernels
(attnkit.functional.linear.kernels) against the same recurrence, and the Gated DeltaNet layer's constant-size cache
decoding on the GPU as one whole pass."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from attnkit.functional.linear import gated_delta_rule, gated_linear_attention, kernels, ssd
from attnkit.layers import GatedDeltaNet, LinearStateCache, Mamba2

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
                           output_final_state=True, backend="torch")
    assert got.output.device.type == CUDA and got.output.dtype == dtype
    assert got.final_state.dtype == torch.float32  # the state is kept in float32, as the models keep it
    assert _relative(got.output, want.output) < TOLERANCES[dtype]
    assert _relative(got.final_state, want.final_state) < TOLERANCES[dtype]


def _needs_fla():
    if importlib.util.find_spec("fla") is None:
        pytest.skip("fla-core is not installed (scripts/gpu_record.sh carries its wheel in .whl/)")


def test_the_rule_equals_flash_linear_attentions_kernel():
    _needs_fla()
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


# name: (function, decay, delta rule)
DISPATCHED = {
    "gated delta rule": (gated_delta_rule, "per-head", True),
    "delta rule": (gated_delta_rule, "none", True),
    "kimi delta attention": (gated_delta_rule, "per-channel", True),
    "gated linear attention, a decay a head": (gated_linear_attention, "per-head", False),
    "gated linear attention, a decay a channel": (gated_linear_attention, "per-channel", False),
    "linear attention, no decay": (gated_linear_attention, "none", False),
}


@pytest.mark.parametrize("case", DISPATCHED)
def test_auto_hands_half_types_to_fla_and_equals_the_float64_recurrence(case):
    """bfloat16 on CUDA runs fla's kernel under backend "auto" (grouped key heads, an initial state, a left-padded
    row with NaN in its padding), within bfloat16's rounding of the float64 recurrence on the same rounded inputs."""
    _needs_fla()
    fn, decay, delta = DISPATCHED[case]
    q, k, v, g, beta = _inputs(decay)
    state = torch.randn(2, 4, 32, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    key_mask = torch.ones(2, q.shape[2], dtype=torch.bool)
    key_mask[0, :9] = False
    v[0, :, 4] = float("nan")
    q, k, v = (x.to(torch.bfloat16).double() for x in (q, k, v))  # the rounded inputs, for both
    args = (q, k, v, g, beta) if delta else (q, k, v, g)
    options = dict(initial_state=state, output_final_state=True, key_mask=key_mask)
    want = fn(*args, chunk_size=1, **options)
    half = [x.to(CUDA, torch.bfloat16) for x in args[:3]] + [None if x is None else x.to(CUDA) for x in args[3:]]
    assert kernels.uses_fla("auto", *half[:3], 64)
    got = fn(*half, **{**options, "initial_state": state.to(CUDA), "key_mask": key_mask.to(CUDA)})
    assert got.output.dtype == torch.bfloat16 and got.final_state.dtype == torch.float32
    assert _relative(got.output, want.output) < TOLERANCES[torch.bfloat16]
    assert _relative(got.final_state, want.final_state) < TOLERANCES[torch.bfloat16]
    assert not kernels.uses_fla("auto", *(x.float() for x in half[:3]), 64)  # float32 stays attnkit's, exact


@pytest.mark.parametrize("case", [name for name in DISPATCHED if DISPATCHED[name][1] != "none"])
def test_fla_gradients_equal_the_float64_recurrences(case):
    _needs_fla()
    fn, decay, delta = DISPATCHED[case]
    leaves = [x for x in _inputs(decay, L=130, seed=1) if x is not None]
    if not delta:
        leaves = leaves[:4]
    weights = torch.randn(2, 4, 130, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    grads = []
    for device, dtype, backend in ((CUDA, torch.float32, "fla"), ("cpu", torch.float64, "torch")):
        xs = [x.to(device, dtype).requires_grad_() for x in leaves]
        out = fn(*xs, backend=backend, **({} if backend == "fla" else {"chunk_size": 1})).output
        (out.double().cpu() * weights).sum().backward()
        grads.append([x.grad for x in xs])
    for got, want in zip(*grads):
        assert _relative(got, want) < 1e-2  # float32 inputs, whose products fla's kernels take in TF32


def test_the_ssd_and_the_mamba2_layer_through_fla_equal_float64():
    _needs_fla()
    g = torch.Generator().manual_seed(3)
    x, dt = torch.randn(2, 8, 200, 16, generator=g), torch.randn(2, 8, 200, generator=g)
    A, D = -torch.rand(8, generator=g), torch.randn(8, generator=g)
    Bm, Cm = torch.randn(2, 2, 200, 32, generator=g), torch.randn(2, 2, 200, 32, generator=g)
    x, Bm, Cm = (t.to(torch.bfloat16).double() for t in (x, Bm, Cm))
    want = ssd(x, dt.double(), A.double(), Bm, Cm, D=D.double(), chunk_size=1).output
    got = ssd(x.to(CUDA, torch.bfloat16), dt.to(CUDA), A.to(CUDA), Bm.to(CUDA, torch.bfloat16),
              Cm.to(CUDA, torch.bfloat16), D=D.to(CUDA)).output
    assert _relative(got, want) < TOLERANCES[torch.bfloat16]
    torch.manual_seed(0)
    layer = Mamba2(64, num_heads=8, head_dim=16, state_size=32, n_groups=2).double().eval()
    tokens = torch.randn(2, 150, 64, dtype=torch.float64)
    with torch.no_grad():
        want = layer(tokens).output
        got = layer.to(CUDA, torch.bfloat16)(tokens.to(CUDA, torch.bfloat16)).output
    assert _relative(got, want) < 5e-2  # the layer's projections and norm in bfloat16 too


def test_auto_trains_through_fla_or_keeps_to_attnkit_where_fla_refuses_its_backward():
    """A call needing gradients goes to fla only where fla's backward runs (fla #640's guard: Hopper, Triton 3.4 to
    3.7.0, no TileLang); either way the backward runs and gives finite gradients."""
    _needs_fla()
    q, k, v, g, beta = (None if x is None else x.to(CUDA, torch.bfloat16 if i < 3 else torch.float32)
                        for i, x in enumerate(_inputs("per-head")))
    q.requires_grad_()
    assert kernels.uses_fla("auto", q, k, v, 64, g, beta) == (not kernels.fla_backward_refused())
    with torch.no_grad():
        assert kernels.uses_fla("auto", q, k, v, 64, g, beta)  # no gradient: fla's forward, guard or not
    gated_delta_rule(q, k, v, g, beta).output.float().square().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
