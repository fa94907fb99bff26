"""Projection calls without ``nn.Module``'s call machinery where that machinery does nothing: one layer
(:func:`project`), or several that read one input through one packed weight (:func:`pack`,
:func:`packed_projection`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as _module

__all__ = ["Packed", "called", "hookless", "pack", "packed_projection", "project", "project_by_name"]


def project(layer: nn.Module | None, x: Tensor) -> Tensor:
    """``layer(x)``. A plain ``nn.Linear`` with no hooks of its own and no global module hooks is
    called as ``F.linear(x, weight, bias)``, the same arithmetic without the module call (1.5-2 us a
    projection on tiny inputs: four of them were most of what MultiHeadAttention cost over its
    projections and SDPA written out, benchmarks/overhead.py). Anything else (a subclass, a LoRA or
    quantised replacement, a module with hooks) is called as a module. (``None`` only to take an entry
    of ``nn.Module._modules`` as typed; a layer's projections are never None.)"""
    assert layer is not None
    if type(layer) is nn.Linear and hookless(layer):
        weight, bias = _weight_bias(layer)
        if weight is not None:
            return F.linear(x, weight, bias)
    return layer(x)


def project_by_name(owner: nn.Module, name: str, x: Tensor) -> Tensor:
    """``owner.<name>(x)`` as :func:`project` makes it, the submodule taken from ``owner._modules`` (the registry
    ``owner.<name>`` reads too, after a failed instance lookup and a call of ``nn.Module.__getattr__``: a
    quarter of a microsecond a projection). A replaced submodule is the one used."""
    return project(owner._modules[name], x)


def hookless(module: nn.Module) -> bool:
    """Whether calling ``module.forward`` is what calling ``module`` does: no hooks on it, no global module
    hooks, and no compiled call of its own (``Module.compile``): ``nn.Module.__call__`` then adds only its own
    checks, about two microseconds a call."""
    return not (_hooked(module) or _global_hooks())


def called(module: nn.Module | None) -> Callable[..., Any]:
    """What calling ``module`` runs: its ``forward`` where ``nn.Module.__call__`` would add nothing
    (:func:`hookless`), else the module itself (its hooks, its compiled call). For the modules a model calls on
    every layer of every decoding step: ``called(block)(x, ...)`` is ``block(x, ...)``. (``None`` only to take an
    entry of ``nn.Module._modules`` as typed, as :func:`project` does.)"""
    assert module is not None
    return module.forward if hookless(module) else module


def _hooked(module: nn.Module) -> bool:
    """Whether ``module`` has hooks of its own, or a compiled call (``Module.compile``) that its call would run."""
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks or getattr(module, "_compiled_call_impl", None) is not None)


def _global_hooks() -> bool:
    """Whether any module hook is registered globally (``nn.modules.module.register_module_*_hook``)."""
    return bool(_module._global_forward_hooks or _module._global_forward_pre_hooks
                or _module._global_backward_hooks or _module._global_backward_pre_hooks)


class Packed(NamedTuple):
    """The weights (and biases) of several ``nn.Linear`` layers as consecutive rows of one tensor
    (:func:`pack`): ``weight`` (sum of outs, in), ``bias`` (sum of outs,) or None, ``parts`` each layer's
    weight (and bias) as the view of ``weight`` (``bias``) it must still be."""

    weight: Tensor
    bias: Tensor | None
    parts: tuple[tuple[Tensor, Tensor | None], ...]

    def holds(self, layers: Sequence[nn.Module | None]) -> bool:
        """Whether every layer's weight and bias still are exactly their parts (storage, offset, sizes, strides).
        A part is never on the meta device (:func:`pack`), so a meta weight or bias (a layer moved there) is not one;
        ``is_set_to`` has no meta kernel to say so."""
        for layer, (w_part, b_part) in zip(layers, self.parts):
            weight, bias = _weight_bias(layer) if isinstance(layer, nn.Linear) else (None, None)
            if weight is None or weight.is_meta or not weight.is_set_to(w_part) or (
                    bias is not None if b_part is None else bias is None or bias.is_meta or not bias.is_set_to(b_part)):
                return False
        return True


def pack(layers: Sequence[nn.Module | None]) -> Packed | None:
    """Re-seat the weights (and biases) of ``layers`` as consecutive rows of one tensor, values and Parameter
    objects kept (each Parameter's ``.data`` becomes its slice), so that one ``F.linear`` projects through all
    of them (:func:`packed_projection`): what ``nn.MultiheadAttention``'s ``in_proj_weight`` is, with each
    projection kept as its own module and state-dict entry. None (nothing changed) unless they are plain
    ``nn.Linear`` layers of one input width, dtype and device, all with biases or none, on a device with memory
    (not meta). Run it where nothing can hold the old tensors yet (a layer's constructor) or where their
    storage was just replaced anyway (``Module._apply``): a reference taken before would keep the old memory."""
    if not layers or not all(type(layer) is nn.Linear for layer in layers):
        return None
    pairs = [_weight_bias(layer) for layer in layers]
    weights = [w for w, _ in pairs if w is not None]
    biases = [b for _, b in pairs if b is not None]
    if len(weights) != len(layers) or len(biases) not in (0, len(layers)):
        return None
    first = weights[0]
    if first.is_meta or any(w.shape[1] != first.shape[1] or w.dtype != first.dtype or w.device != first.device
                            or w.dim() != 2 for w in weights):
        return None
    sizes = [w.shape[0] for w in weights]
    with torch.no_grad():
        weight = torch.cat([w.detach() for w in weights])
        bias = torch.cat([b.detach() for b in biases]) if biases else None
    weight_parts = weight.split(sizes)
    bias_parts: tuple[Tensor | None, ...] = (None,) * len(layers) if bias is None else bias.split(sizes)
    for w, w_part in zip(weights, weight_parts):
        w.data = w_part  # the same Parameter object, now a slice: an optimizer holding it still does
    for b, b_part in zip(biases, bias_parts):
        b.data = b_part  # type: ignore[assignment]
    return Packed(weight, bias, tuple(zip(weight_parts, bias_parts)))


def packed_projection(packed: Packed | None, layers: Sequence[nn.Module | None], x: Tensor) -> Tensor | None:
    """``torch.cat([layer(x) for layer in layers], -1)`` as one ``F.linear`` through ``packed`` (:func:`pack`),
    or None where the layers no longer are what was packed or the one call would not be theirs: a layer
    replaced, hooked or not a plain ``nn.Linear``; a weight or bias re-seated, by any means (each must still be
    exactly its slice: storage, offset, sizes and strides); a weight gradient to compute (autograd would give it
    to the packed tensor, not the Parameters); compiling (the check reads storage pointers). Writes into the
    weights, in place or through ``.data`` or numpy, are the packed tensor's own: nothing is copied or kept."""
    if packed is None or torch.compiler.is_compiling() or _global_hooks():
        return None
    grad = torch.is_grad_enabled()
    for layer, (w_part, b_part) in zip(layers, packed.parts):
        if type(layer) is not nn.Linear or _hooked(layer):
            return None
        weight, bias = _weight_bias(layer)
        if weight is None or not weight.is_set_to(w_part) or (grad and weight.requires_grad):
            return None
        if b_part is None:
            if bias is not None:  # a bias given to a layer packed without one
                return None
        elif bias is None or not bias.is_set_to(b_part) or (grad and bias.requires_grad):
            return None
    return F.linear(x, packed.weight, packed.bias)


def _weight_bias(layer) -> tuple[Tensor | None, Tensor | None]:
    """A plain ``nn.Linear``'s weight and bias from its parameter registry (``layer.weight`` goes through
    ``nn.Module.__getattr__``: 1-2 us a projection on tiny inputs); (None, None) where either was deleted
    from it (and perhaps set as a plain attribute), which the callers leave to the module's own call."""
    parameters = layer._parameters
    try:
        return parameters["weight"], parameters["bias"]
    except KeyError:
        return None, None
