"""transformers' models compared with attnkit's in float64: transformers casts to float32 inside many modules whatever
the model's dtype (eager's and the routers' softmaxes, norms, rotary angles, the hybrids' delta rules and gates), so
that its float64 model computes float32's numbers. :func:`float64_inside` keeps those steps in float64 and
:func:`float64_copy` makes a float64 copy of a model; :func:`assert_float64_logits_equal` holds attnkit's float64
model, run as it is, to the same logits. Used by the native models' tests (1e-10), the bridge's (eager against
attnkit, both run inside: 1e-12) and context parallelism's (1e-10): docs/testing.md."""

from __future__ import annotations

import contextlib
import copy

import torch
from torch.overrides import TorchFunctionMode

from hybrid_checks import ids


class _Float64Inside(TorchFunctionMode):
    """Every float32 a torch call asks for is float64: a dtype argument (positional or keyword) and
    ``Tensor.float()``. Other dtypes, and float32 tensors that already exist, are left as they are."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.float:
            func = torch.Tensor.double
        args = tuple(torch.float64 if a is torch.float32 else a for a in args)
        kwargs = {k: torch.float64 if v is torch.float32 else v for k, v in (kwargs or {}).items()}
        return func(*args, **kwargs)


@contextlib.contextmanager
def float64_inside():
    """Within the block, torch computes in float64 where a call asks for float32 and where it picks the default
    dtype (:class:`_Float64Inside`)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with _Float64Inside():
            yield
    finally:
        torch.set_default_dtype(default)


def float64_copy(theirs):
    """A float64 copy of transformers' model whose tables made in float32 at its construction (the rotary
    frequencies, MiniMax's decay tables) are made again in float64, and whose experts run one by one (its grouped
    kernel takes no float64). Call it, and the copy, inside :func:`float64_inside` (outside, the tables made again
    would be float32's: refused)."""
    if torch.get_default_dtype() != torch.float64:
        raise RuntimeError("float64_copy makes its tables again in the default dtype: call it inside float64_inside()")
    theirs = copy.deepcopy(theirs).double()
    for module in theirs.modules():
        if hasattr(module, "config") and hasattr(module.config, "_experts_implementation"):
            module.config._experts_implementation = "eager"
        if isinstance(getattr(module, "inv_freq", None), torch.Tensor):  # a rotary embedding: made again
            fresh = type(module)(module.config)
            module.inv_freq, module.original_inv_freq = fresh.inv_freq, fresh.original_inv_freq
            module.attention_scaling = fresh.attention_scaling
        if hasattr(module, "decay_factors"):
            module.query_decay, module.key_decay, module.diagonal_decay = module.decay_factors(module.slope_rate)
    return theirs


def assert_float64_logits_equal(ours, theirs, *, tol: float = 1e-10, seed: int = 1) -> None:
    """attnkit's float64 model, run as it is, and transformers' (:func:`float64_copy`, run inside
    :func:`float64_inside`) give the same logits to ``tol``, on a batch as it is and with its second row left-padded
    by four (its real positions compared)."""
    tokens = ids(seed)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :4] = 0
    real = mask.bool()
    with torch.no_grad():
        got, got_padded = ours(tokens).logits, ours(tokens, mask).logits
        with float64_inside():
            theirs = float64_copy(theirs)
            want, want_padded = theirs(tokens).logits, theirs(tokens, attention_mask=mask).logits
    assert got.dtype == want.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    torch.testing.assert_close(got_padded[real], want_padded[real], rtol=tol, atol=tol)


@contextlib.contextmanager
def in_dtype(dtype: torch.dtype, models, inputs: dict):
    """(models, inputs) as they are for float32; for float64, :func:`float64_copy` of each model and the inputs'
    floating tensors in float64, the block run inside :func:`float64_inside`: one test body for both dtypes."""
    if dtype == torch.float32:
        yield models, inputs
        return
    with float64_inside():
        yield ([float64_copy(m) for m in models],
               {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in inputs.items()})
