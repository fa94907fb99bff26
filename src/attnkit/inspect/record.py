"""Record the attention weights of every :class:`~attnkit.layers.MultiHeadAttention` in a model
during one forward pass, without changing the model's code:

    with record_attention(model) as records:
        model(source, lengths, target_in)
    records["decoder.layers.0.cross_attn"]  # [(B, H, L, S)], one entry per call

Each attention module is asked for its weights (``need_weights=True``) by a forward pre-hook;
the weights are exact whatever backend computes the output (see ``attention(need_weights=)``).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator

from torch import Tensor, nn

from ..layers import MultiHeadAttention

__all__ = ["record_attention"]


@contextlib.contextmanager
def record_attention(model: nn.Module) -> Iterator[dict[str, list[Tensor]]]:
    """Yield a dict that fills, per attention module name, with the (B, H, L, S) weights of each call."""
    records: dict[str, list[Tensor]] = defaultdict(list)
    handles = []

    def ask(module, args, kwargs):
        return args, {**kwargs, "need_weights": True}

    def keep(name):
        def hook(module, args, kwargs, output):
            records[name].append(output.weights.detach())

        return hook

    for name, module in model.named_modules():
        if isinstance(module, MultiHeadAttention):
            handles.append(module.register_forward_pre_hook(ask, with_kwargs=True))
            handles.append(module.register_forward_hook(keep(name), with_kwargs=True))
    if not handles:
        raise ValueError(f"{type(model).__name__} has no MultiHeadAttention module to record")
    try:
        yield records
    finally:
        for handle in handles:
            handle.remove()
