"""The flash-linear-attention dispatch (attnkit.functional.linear.kernels) run on the CPU: fla's own Triton kernels
under Triton's interpreter, held to attnkit's float64 recurrence. Not collected by the main run (fla and Triton are
not in its environment, where transformers would hand its own linear models to them): tests/functional/test_linear_kernels.py
runs this file in a child pytest with ``TRITON_INTERPRET=1`` and the separate fla install on the path."""

from __future__ import annotations

import os

import pytest
import torch
import triton_interpreter  # noqa: F401  (the interpreter's two gaps closed before fla defines a kernel)

from attnkit.functional.linear import gated_delta_rule, gated_linear_attention, kernels, ssd

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1 (tests/functional/test_linear_kernels.py does)"

B, HK, H, L, K, V = 1, 1, 2, 80, 16, 8  # two value heads on one key head; 80 tokens: two of fla's 64-token chunks
# (one sequence: the interpreter runs a kernel's program per batch and head, one after another)

# name: (function, decay shape (None: no decay), delta rule)
CASES = {
    "gated delta rule": (gated_delta_rule, "head", True),
    "delta rule": (gated_delta_rule, None, True),
    "kimi delta attention": (gated_delta_rule, "channel", True),
    "gated linear attention, a decay a head": (gated_linear_attention, "head", False),
    "gated linear attention, a decay a channel": (gated_linear_attention, "channel", False),
    "linear attention, no decay": (gated_linear_attention, None, False),
}


def _inputs(decay, delta, length=L, batch=B, generator=None):
    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    q, k, v = randn(batch, HK, length, K), randn(batch, HK, length, K), randn(batch, H, length, V)
    g = None
    if decay == "head":
        g = -torch.rand(batch, H, length, generator=generator) * 0.3
    elif decay == "channel":
        g = -torch.rand(batch, H, length, K, generator=generator) * 0.3
    beta = torch.rand(batch, H, length, generator=generator) if delta else None
    return q, k, v, g, beta, randn(batch, H, K, V)


def _call(fn, q, k, v, g, beta, state, delta, **options):
    args = (q, k, v, g, beta) if delta else (q, k, v, g)
    extra = {"use_qk_l2norm": True} if delta else {}
    return fn(*args, initial_state=state, output_final_state=True, **extra, **options)


def _relative(x, reference):
    return float((x.double() - reference).abs().max() / reference.abs().max())


@pytest.mark.parametrize("case", CASES)
def test_fla_equals_the_float64_recurrence(case):
    fn, decay, delta = CASES[case]
    q, k, v, g, beta, state = _inputs(decay, delta, generator=torch.Generator().manual_seed(0))
    key_mask = torch.ones(B, L, dtype=torch.bool)
    key_mask[0, :7] = False  # a left-padded row, whose padding holds NaN: selected away, it reaches nothing
    v[0, :, 3] = float("nan")
    out, final = _call(fn, q, k, v, g, beta, state, delta, key_mask=key_mask, backend="fla")
    reference = _call(fn, *(None if x is None else x.double() for x in (q, k, v, g, beta, state)), delta,
                      key_mask=key_mask, backend="torch", chunk_size=1)
    assert out.dtype == torch.float32 and final.dtype == torch.float32
    assert _relative(out, reference.output) < 1e-5
    assert _relative(final, reference.final_state) < 1e-5
    assert (out[0, :, :7] == 0).all()


@pytest.mark.parametrize("case", [name for name in CASES if CASES[name][1] is not None])
def test_fla_gradients_equal_the_float64_recurrence(case):
    fn, decay, delta = CASES[case]
    leaves = [x.requires_grad_() for x in _inputs(decay, delta, length=70, batch=1,
                                                    generator=torch.Generator().manual_seed(1)) if x is not None]
    weights = torch.randn(1, H, 70, V, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    grads = []
    for backend, dtype in (("fla", torch.float32), ("torch", torch.float64)):
        xs = [x.to(dtype) for x in leaves]
        q, k, v, g, *rest = xs
        beta, state = (rest[0], rest[1]) if delta else (None, rest[0])
        out, final = _call(fn, q, k, v, g, beta, state, delta, backend=backend)
        ((out.double() * weights).sum() + final.double().square().sum()).backward()
        grads.append([x.grad for x in leaves])
        for x in leaves:
            x.grad = None
    for ours, reference in zip(*grads):
        assert _relative(ours, reference) < 1e-5


def test_the_ssd_through_fla_equals_the_float64_recurrence():
    g = torch.Generator().manual_seed(3)
    heads, groups, P, N = 4, 2, 8, 16
    x, dt = torch.randn(B, heads, L, P, generator=g), torch.randn(B, heads, L, generator=g)
    A, D, dt_bias = -torch.rand(heads, generator=g), torch.randn(heads, generator=g), torch.randn(heads, generator=g)
    Bm, Cm = torch.randn(B, groups, L, N, generator=g), torch.randn(B, groups, L, N, generator=g)
    key_mask = torch.ones(B, L, dtype=torch.bool)
    key_mask[0, :5] = False
    out, final = ssd(x, dt, A, Bm, Cm, D=D, dt_bias=dt_bias, key_mask=key_mask, output_final_state=True, backend="fla")
    reference = ssd(*(t.double() for t in (x, dt, A, Bm, Cm)), D=D.double(), dt_bias=dt_bias.double(),
                    key_mask=key_mask, output_final_state=True, backend="torch", chunk_size=1)
    assert _relative(out, reference.output) < 1e-5
    assert _relative(final, reference.final_state) < 1e-5


def test_fla_in_float16_is_within_its_rounding():
    q, k, v, g, beta, _ = _inputs("head", True, generator=torch.Generator().manual_seed(4))
    out = gated_delta_rule(q.half(), k.half(), v.half(), g, beta, use_qk_l2norm=True, backend="fla").output
    reference = gated_delta_rule(q.double(), k.double(), v.double(), g.double(), beta.double(), use_qk_l2norm=True,
                                 chunk_size=1).output
    assert out.dtype == torch.float16
    assert _relative(out, reference) < 1e-2


def test_auto_keeps_the_cpu_on_attnkits_form():
    q, k, v, g, beta, _ = _inputs("head", True)
    assert kernels.fla_installed()
    assert not kernels.uses_fla("auto", q, k, v, 64)
    assert kernels.uses_fla("fla", q, k, v, 64)


def test_fla_on_the_cpu_without_the_interpreter_is_refused(monkeypatch):
    q, k, v, g, beta, _ = _inputs("head", True)
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="backend='fla' runs Triton kernels: q must be on a CUDA device, got cpu"):
        gated_delta_rule(q, k, v, g, beta, backend="fla")


def test_the_ssd_equals_flas_naive_simple_gla_reference():
    """Mamba-2's SSD in attnkit's chunked form against fla's own PyTorch reference of simple GLA (no kernel), fed
    the duality's arguments by hand: q = C and k = B repeated to each head of their group, v = dt x, g = dt A, no
    scale; plus the skip D x."""
    from fla.ops.simple_gla.naive import naive_recurrent_simple_gla

    g = torch.Generator().manual_seed(6)
    heads, groups, P, N = 4, 2, 8, 16
    x, dt = torch.randn(B, heads, L, P, generator=g), torch.randn(B, heads, L, generator=g)
    A, D, dt_bias = -torch.rand(heads, generator=g), torch.randn(heads, generator=g), torch.randn(heads, generator=g)
    Bm, Cm = torch.randn(B, groups, L, N, generator=g), torch.randn(B, groups, L, N, generator=g)
    ours, state = ssd(x, dt, A, Bm, Cm, D=D, dt_bias=dt_bias, output_final_state=True, backend="torch")
    step = torch.nn.functional.softplus(dt + dt_bias[:, None])  # (B, H, L)
    per_head = heads // groups

    def fla_layout(t):
        return t.transpose(1, 2)  # (B, L, H, .)

    theirs, their_state = naive_recurrent_simple_gla(
        fla_layout(Cm.repeat_interleave(per_head, dim=1)), fla_layout(Bm.repeat_interleave(per_head, dim=1)),
        fla_layout(x * step[..., None]), fla_layout(step * A[:, None]), scale=1.0, output_final_state=True)
    theirs = theirs.transpose(1, 2) + x * D[:, None, None]  # back to (B, H, L, P), with the skip
    assert _relative(ours, theirs.double()) < 1e-5
    assert _relative(state, their_state.double()) < 1e-5


@pytest.mark.parametrize("name", ["GatedDeltaNet", "Mamba2"])
def test_a_layer_through_fla_equals_its_own_form(name, monkeypatch):
    """A layer with ``backend="fla"``: a left-padded batch, then a prefill and decoding steps through its cache,
    equal to the same layer's ``backend="torch"``."""
    from attnkit.layers import GatedDeltaNet, LinearStateCache, Mamba2

    torch.manual_seed(7)
    layer = GatedDeltaNet(32, 2, 4, 8, 8) if name == "GatedDeltaNet" else Mamba2(32, 4, 8, 16, n_groups=2)
    x = torch.randn(1, 70, 32)
    key_mask = torch.ones(1, 70, dtype=torch.bool)
    key_mask[0, :6] = False

    def run(backend):
        layer.backend = backend
        whole = layer(x, key_mask=key_mask).output
        cache = LinearStateCache()
        parts = [layer(x[:, :66], cache=cache).output] + [layer(x[:, t:t + 1], cache=cache).output
                                                          for t in range(66, 70)]
        return whole, torch.cat(parts, dim=1)

    from attnkit.functional.linear import delta

    calls = []
    real = delta.fla_linear
    monkeypatch.setattr(delta, "fla_linear", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    through_fla = run("fla")
    assert len(calls) == 6  # "fla" is fla on every call: the padded batch, the prefill and the four steps
    for ours, reference in zip(through_fla, run("torch")):
        assert _relative(ours, reference.double()) < 1e-5
    assert len(calls) == 6  # and "torch" never
