"""Whether attnkit may read a tensor's values on the host now.

Some per-call shortcuts read a value on the host: a mask's look for rows with no allowed key, a bias's look for
masked keys. That is not possible, or not wanted, in two cases:

- while ``torch.compile`` or ``torch.export`` traces, where a read would break the graph (export has no breaks);
- under a ``torch.func`` transform (``vmap``, ``grad``, ``jacrev``, ...). Under ``vmap`` a tensor holds no single
  value to read. The other transforms take the same path, so that they nest with ``vmap`` in any order.

In both cases attnkit takes the paths that read nothing: masks are filled rather than looked at. Under a transform, ``auto`` also leaves out the tiled loop and flex. The tiled loop
looks at its tiles, and its autograd.Function has no functorch rule. PyTorch traces flex_attention with TorchDynamo,
which does not take a transform's tensors. Under ``torch.export`` ``auto`` does the same and also asks no size
(:func:`one_graph`): with dynamic shapes a size is a symbol, and a comparison with a routing threshold would be a
guard that narrows the range of lengths the user declared.

A third question is whether a tensor built now may be kept and served to later calls (:func:`may_keep`): not
while compiling or exporting, nor under ``FakeTensorMode`` (which ``torch.export`` traces under) or a proxy tracer
(a fake or traced tensor kept in a cache would be handed to the next eager call), nor during CUDA-graph
capture (where kernels are recorded, not run: a tensor built then holds nothing until the graph is replayed).
"""

from __future__ import annotations

import torch

from .devices import device_type

__all__ = ["traced", "transformed", "is_compiling", "exporting", "one_graph", "refuse_in_one_graph", "may_keep", "exportable"]

transformed = torch._C._are_functorch_transforms_active
"""Whether a torch.func transform is active (0.04 us a call)."""


is_compiling = torch.compiler.is_compiling
"""Whether torch.compile or torch.export traces (bound once: a module global is read where attnkit asks per call).
Then attnkit compares no sizes (they may be symbols, and a comparison a guard) and looks at no value (a host read
is a graph break): the plain call's shortcut steps aside (:mod:`.plain`), and
``attention()``'s direct path hands SDPA a mask or a block mask without looking at it."""


_compiler = torch.compiler


def _exporting_flag() -> bool:
    return _compiler._is_exporting_flag


exporting = _exporting_flag if hasattr(torch.compiler, "_is_exporting_flag") else torch.compiler.is_exporting
"""Whether ``torch.export`` traces now (strict or not), and not ``torch.compile``. The flag that
``torch.compiler.is_exporting()`` returns is read directly where this PyTorch has it: before torch 2.13, TorchDynamo
folds ``is_exporting()`` to True under any ``torch.compile`` (measured on torch 2.11: plain compile then refused
``backend="tiled"``, ``backend="flex"`` and LongformerSelfAttention as if exporting), while it reads a module's flag
as it is."""


def one_graph() -> bool:
    """Whether ``auto`` must choose among the backends that trace into one graph (SDPA, reference) without a look
    at a value or a question of sizes: under a torch.func transform, and under ``torch.export``, whose graph has no
    breaks and whose shapes may be symbols (a size compared would narrow the range the user declared)."""
    return transformed() or exporting()


def refuse_in_one_graph(backend: str, *, transformed_because: str, exported_because: str) -> None:
    """The one refusal of a backend that cannot run under a torch.func transform or be exported (the tiled loop,
    flex): a ValueError naming the backend, why (``transformed_because`` / ``exported_because``) and what to use."""
    instead = "use backend='auto' (which leaves it out there), 'sdpa' or 'reference'"
    if transformed():
        raise ValueError(f"backend={backend!r} cannot run under a torch.func transform (vmap, grad, jacrev, ...): "
                         f"{transformed_because}; {instead}")
    if exporting():
        raise ValueError(f"backend={backend!r} cannot be exported (torch.export): {exported_because}; {instead}")


def traced() -> bool:
    """Whether values are out of the host's reach: compiling or under a torch.func transform (the module)."""
    return torch.compiler.is_compiling() or transformed()


_dispatch_modes = torch._C._len_torch_dispatch_stack  # (0.07 us; asking for a mode by its key costs 0.11 each)
_mode = torch._C._get_dispatch_mode
_FAKE, _PROXY = torch._C._TorchDispatchModeKey.FAKE, torch._C._TorchDispatchModeKey.PROXY


def may_keep(device: torch.device) -> bool:
    """Whether a tensor built now on ``device`` may be kept for later calls (the module): not while compiling or
    exporting, under a fake tensor mode or a proxy tracer (``make_fx``), or during CUDA-graph capture. Other
    dispatch modes (an op counter, a profiler's) see real tensors, and what they see is kept as without them."""
    if torch.compiler.is_compiling() or (_dispatch_modes() and (_mode(_FAKE) is not None
                                                                or _mode(_PROXY) is not None)):
        return False
    return device_type(device) != "cuda" or not torch.cuda.is_current_stream_capturing()


def exportable(cls):
    """The NamedTuple ``cls`` (a module's output: AttentionOutput, LMOutput, ...) registered with torch's pytree
    under its import path, so that a program ``torch.export`` traced through a module returning it can be saved
    (``torch.export.save``) and loaded; torch refuses to serialise an unregistered namedtuple."""
    torch.utils._pytree._register_namedtuple(cls, serialized_type_name=f"{cls.__module__}.{cls.__qualname__}")
    return cls
