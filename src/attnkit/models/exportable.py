"""A :class:`~attnkit.models.DecoderLM` with its KV caches as buffers, for ``torch.export``.

    step = ExportableDecoderLM(model, batch_size=1, capacity=256)
    program = torch.export.export(step, (torch.zeros(1, 1, dtype=torch.long),))
    decode = program.module()      # each call runs the next tokens and writes their keys and values in place
    logits = decode(prompt_token)  # (1, 1, V); then the next token, and so on

The caches are fixed-size (:class:`~attnkit.layers.FixedKVCache`, transformers' ``StaticCache``): every step has the
same shapes and reads nothing on the host, so the step traces into one graph whose buffers are the caches' storage
and their write positions (transformers' ``TorchExportableModuleWithStaticCache`` does the same for its models).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..functional.checks import check_int
from ..layers.cache import FixedKVCache
from .decoder import DecoderLM

__all__ = ["ExportableDecoderLM"]


class ExportableDecoderLM(nn.Module):
    """``model`` with fixed-size KV caches of ``capacity`` positions for ``batch_size`` rows, held as buffers.

    :meth:`forward` runs the tokens that follow the cached ones (the prompt, then one token a step) and returns their
    logits; it writes their keys and values into the buffers and advances the write position, in place. Exported,
    the buffers become the program's mutable state, which every ``program.module()`` shares (torch.export's
    modules hold the program's own state tensors): :meth:`empty` of one starts a new sequence in all.
    Prompt + generated tokens must fit in ``capacity`` (nothing reads the device to check it:
    :class:`~attnkit.layers.FixedKVCache`).

    Export the one-token step, ``input_ids`` (B, 1), and feed a prompt a token a call: a program exported with a
    dynamic length takes no length of 1 (torch.export specialises sizes 0 and 1), and two programs do not share
    their buffers.
    """

    def __init__(self, model: DecoderLM, batch_size: int, capacity: int) -> None:
        super().__init__()
        if not isinstance(model, DecoderLM):
            raise TypeError(f"model must be an attnkit DecoderLM, got {type(model).__name__}")
        check_int("batch_size", batch_size, 1)
        self.model = model
        caches = model.new_cache(capacity=capacity)  # (checks capacity against the model)
        self.caches = [cache for cache in caches if isinstance(cache, FixedKVCache)]
        assert len(self.caches) == len(caches)
        device = next(model.parameters()).device
        # One token allocates every cache's storage at its layer's shapes and dtype: ordinary tensors even when built
        # under inference_mode (an inference tensor's in-place write outside it is an error, and export writes).
        with torch.inference_mode(False), torch.no_grad():
            model(torch.zeros(batch_size, 1, dtype=torch.long, device=device), cache=self.caches)
        for i, cache in enumerate(self.caches):
            keys, values, next_column = cache.tensors()
            self.register_buffer(f"cache_{i}_keys", keys)
            self.register_buffer(f"cache_{i}_values", values)
            self.register_buffer(f"cache_{i}_next", next_column)
        self.reset()

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None) -> Tensor:
        """Logits (B, L, V) of ``input_ids`` (B, L), the tokens after the cached ones. ``attention_mask``
        (B, capacity), True at real tokens, and ``position_ids`` (B, L) as :meth:`DecoderLM.forward` takes them with
        fixed-size caches (left padding)."""
        for i, cache in enumerate(self.caches):  # the buffers as they are now (torch.export swaps in its own)
            cache.use(getattr(self, f"cache_{i}_keys"), getattr(self, f"cache_{i}_values"),
                      getattr(self, f"cache_{i}_next"))
        return self.model(input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=self.caches).logits

    def reset(self) -> None:
        """Empty the caches (zeros, written in place: the buffers stay the same tensors)."""
        self.empty(self)

    @staticmethod
    def empty(module: nn.Module) -> None:
        """Empty the caches of an ExportableDecoderLM or of a module torch.export made from one
        (``program.module()``): its ``cache_*`` buffers zeroed in place, the model's own buffers left alone."""
        cached = [buffer for name, buffer in module.named_buffers() if name.startswith("cache_")]
        if not cached:
            raise ValueError(f"{type(module).__name__} has no cache_* buffers: pass an ExportableDecoderLM or a "
                             "module exported from one")
        for buffer in cached:
            buffer.zero_()
