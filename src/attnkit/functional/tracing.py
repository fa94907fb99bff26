"""Whether attnkit may read a tensor's values on the host now.

Some per-call shortcuts read a value on the host: the NaN rule's one look, a mask's look for rows with no
allowed key, a bias's look for masked keys. That is not possible, or not wanted, in two cases:

- while ``torch.compile`` traces, where a read would break the graph;
- under a ``torch.func`` transform (``vmap``, ``grad``, ``jacrev``, ...). Under ``vmap`` a tensor holds no single
  value to read. The other transforms take the same path, so that they nest with ``vmap`` in any order.

In both cases attnkit takes the paths that read nothing. The NaN rule finds its rows without a look, and masks are
filled rather than looked at. Under a transform, ``auto`` also leaves out the tiled loop and flex. The tiled loop
looks at its tiles, and its autograd.Function has no functorch rule. PyTorch traces flex_attention with TorchDynamo,
which does not take a transform's tensors.
"""

from __future__ import annotations

import torch

__all__ = ["traced", "transformed"]

transformed = torch._C._are_functorch_transforms_active
"""Whether a torch.func transform is active (0.04 us a call)."""


def traced() -> bool:
    """Whether values are out of the host's reach: compiling or under a torch.func transform (the module)."""
    return torch.compiler.is_compiling() or transformed()
