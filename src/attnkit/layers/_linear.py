"""A projection call without ``nn.Module``'s call machinery where that machinery does nothing."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as _module

__all__ = ["project", "project_by_name"]


def project(layer: nn.Module | None, x: Tensor) -> Tensor:
    """``layer(x)``. A plain ``nn.Linear`` with no hooks of its own and no global module hooks is
    called as ``F.linear(x, weight, bias)``, the same arithmetic without the module call (1.5-2 us a
    projection on tiny inputs: four of them were most of what MultiHeadAttention cost over its
    projections and SDPA written out, benchmarks/overhead.py). Anything else (a subclass, a LoRA or
    quantised replacement, a module with hooks) is called as a module. (``None`` only to take an entry
    of ``nn.Module._modules`` as typed; a layer's projections are never None.)"""
    assert layer is not None
    if (type(layer) is nn.Linear and not (layer._forward_hooks or layer._forward_pre_hooks or layer._backward_hooks
                                          or layer._backward_pre_hooks)
            and not (_module._global_forward_hooks or _module._global_forward_pre_hooks
                     or _module._global_backward_hooks or _module._global_backward_pre_hooks)):
        return F.linear(x, layer.weight, layer.bias)
    return layer(x)


def project_by_name(owner: nn.Module, name: str, x: Tensor) -> Tensor:
    """``owner.<name>(x)`` as :func:`project` makes it, the submodule taken from ``owner._modules`` (the registry
    ``owner.<name>`` reads too, after a failed instance lookup and a call of ``nn.Module.__getattr__``: a
    quarter of a microsecond a projection). A replaced submodule is the one used."""
    return project(owner._modules[name], x)
