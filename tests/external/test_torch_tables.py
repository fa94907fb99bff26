"""torch's own test tables run against attnkit's drop-ins: every CPU sample of the
OpInfo of ``torch.nn.functional.scaled_dot_product_attention`` (``torch.testing._internal``'s
``op_db``) through ``attnkit.scaled_dot_product_attention``: the same output and gradients, float32 and
float64 (a sample with dropout: the same shape, since the two draw different masks)."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

import attnkit
from attnkit.layers import TorchMultiheadAttention

pytest.importorskip("expecttest")  # torch.testing._internal needs it (attnkit's test extra installs it)
TOLERANCES = {torch.float32: dict(rtol=1e-5, atol=5e-5), torch.float64: dict(rtol=1e-10, atol=1e-10)}


@functools.cache
def _info(table: str):
    """torch's OpInfo of SDPA or ModuleInfo of nn.MultiheadAttention, imported when a test first runs: the
    tables take seconds to import, which every test process would pay at collection."""
    if table == "op":
        from torch.testing._internal.common_methods_invocations import op_db

        return next(op for op in op_db if op.name == "nn.functional.scaled_dot_product_attention")
    from torch.testing._internal.common_modules import module_db

    return next(info for info in module_db if info.module_cls is torch.nn.MultiheadAttention)


def _samples(dtype):
    return list(_info("op").sample_inputs("cpu", dtype, requires_grad=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_every_opinfo_sample_of_sdpa_gives_torchs_result(dtype):
    samples = _samples(dtype)
    assert len(samples) >= 20  # the table is there (a torch without it would pass vacuously)
    compared = 0
    for sample in samples:
        args, kwargs = [sample.input, *sample.args], dict(sample.kwargs)
        what = f"{[tuple(a.shape) for a in args]} {sorted(kwargs)}"
        got = attnkit.scaled_dot_product_attention(*args, **kwargs)
        if kwargs.get("dropout_p", 0.0) > 0:
            assert got.shape == F.scaled_dot_product_attention(*args, **kwargs).shape, what
            continue
        want = F.scaled_dot_product_attention(*args, **kwargs)
        torch.testing.assert_close(got, want, **TOLERANCES[dtype], msg=lambda m, w=what: f"{w}: {m}")
        d_out = torch.randn_like(want)
        inputs = [a for a in args if a.requires_grad]
        got_grads = torch.autograd.grad(got, inputs, d_out)
        want_grads = torch.autograd.grad(want, inputs, d_out)
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w, rtol=10 * TOLERANCES[dtype]["rtol"], atol=10 * TOLERANCES[dtype]["atol"],
                                       msg=lambda m, w=what: f"{w} gradient: {m}")
        compared += 1
    assert compared >= 10


@pytest.mark.parametrize("case", ["scale 0", "negative scale", "float32 mask, float64 query", "3-D query, 4-D keys",
                                  "grouped, broadcast batch"])
def test_the_calls_torch_takes_that_attnkit_refused(case, rng):
    """Calls torch's table once saw refused, each now giving torch's numbers."""
    def randn(*shape):
        return torch.randn(*shape, generator=rng)

    q, k, v = randn(2, 4, 3, 8), randn(2, 4, 6, 8), randn(2, 4, 6, 8)
    kwargs: dict = {}
    if case == "scale 0":
        kwargs = {"scale": 0.0}
    elif case == "negative scale":
        kwargs = {"scale": -0.5}
    elif case == "float32 mask, float64 query":  # torch takes a float32 mask with any query dtype
        q, k, v = q.double(), k.double(), v.double()
        kwargs = {"attn_mask": randn(3, 6)}
    elif case == "3-D query, 4-D keys":
        q = randn(4, 3, 8)
    else:
        q, k, v = randn(1, 4, 3, 8), randn(2, 2, 6, 8), randn(2, 2, 6, 8)
        kwargs = {"enable_gqa": True}
    torch.testing.assert_close(attnkit.scaled_dot_product_attention(q, k, v, **kwargs),
                               F.scaled_dot_product_attention(q, k, v, **kwargs), rtol=1e-5, atol=1e-5)




@pytest.mark.slow
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_every_moduleinfo_sample_of_multihead_attention_gives_torchs_result(dtype, training):
    """torch's ModuleInfo samples of nn.MultiheadAttention (add_bias_kv, add_zero_attn, batch_first, bias,
    masks, unbatched inputs) built with torch's constructor arguments from the same seed: the same parameters
    under the same names, the same outputs and weights, and the same parameter gradients."""
    info = _info("module")
    inputs = info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=False, training=training)
    assert len(inputs) >= 32
    extras = 0
    for number, sample in enumerate(inputs):
        args, kwargs = sample.constructor_input.args, sample.constructor_input.kwargs
        extras += bool(kwargs.get("add_bias_kv") or kwargs.get("add_zero_attn"))
        torch.manual_seed(number)
        theirs = torch.nn.MultiheadAttention(*args, **kwargs, dtype=dtype).train(training)
        torch.manual_seed(number)
        ours = TorchMultiheadAttention(*args, **kwargs, dtype=dtype).train(training)
        what = f"sample {number}: {kwargs}"
        assert list(ours.state_dict()) == list(theirs.state_dict()), what
        forward_args, forward_kwargs = sample.forward_input.args, sample.forward_input.kwargs
        want = theirs(*forward_args, **forward_kwargs)
        got = ours(*forward_args, **forward_kwargs)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, **TOLERANCES[dtype], msg=lambda m, w=what: f"{w}: {m}")
        got[0].sum().backward()
        want[0].sum().backward()
        grads = dict(theirs.named_parameters())
        for name, parameter in ours.named_parameters():
            torch.testing.assert_close(parameter.grad, grads[name].grad, **TOLERANCES[dtype],
                                       msg=lambda m, w=what, n=name: f"{w} {n}: {m}")
    assert extras >= len(inputs) // 2  # the samples with a learned or zero key are run, not skipped
