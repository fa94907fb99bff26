"""Exact attention weights of chosen heads of chosen modules, captured while the outputs stay on
attnkit's fast path (:func:`record`)."""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from torch import Tensor, nn

from .families import IMPLEMENTATION

__all__ = ["Recording", "record", "attention_modules", "RECORDING", "recording_now"]


@dataclass
class Recording:
    """What :func:`record` captured: per attention module (by its name in the model) the weights
    (B, len(heads), L, S) of every call, in call order (one per forward; one per step in generation)."""

    heads: dict[int, list[int]]  # id(module) -> heads to capture
    names: dict[int, str]
    weights: dict[str, list[Tensor]] = field(default_factory=dict)

    def heads_of(self, module: nn.Module) -> list[int] | None:
        return self.heads.get(id(module))

    def store(self, module: nn.Module, weights: Tensor) -> None:
        self.weights.setdefault(self.names[id(module)], []).append(weights.detach())


RECORDING: contextvars.ContextVar[Recording | None] = contextvars.ContextVar("attnkit_hf_recording", default=None)
_open = 0  # recordings open in any thread: read first, a plain global, which TorchDynamo traces (and guards on)
_open_lock = threading.Lock()


def recording_now() -> Recording | None:
    """The recording open in this context, if any. With none open anywhere the ContextVar is not read: TorchDynamo
    cannot trace ``ContextVar.get`` (a graph break in every layer of a compiled model, which
    ``torch.compile(fullgraph=True)`` refuses); a compiled model is compiled again when a recording opens."""
    return RECORDING.get() if _open else None


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The attention modules of a transformers model, in ``named_modules`` order: the innermost
    modules whose class name ends in "Attention" (BertSelfAttention, not the BertAttention that
    wraps it; LlamaAttention; BartAttention for self and cross attention alike)."""
    candidates = [(name, m) for name, m in model.named_modules() if type(m).__name__.endswith("Attention")]
    chosen = {id(m) for _, m in candidates}
    return [(name, m) for name, m in candidates
            if not any(id(inner) in chosen for inner in m.modules() if inner is not m)]


@contextlib.contextmanager
def record(model: nn.Module, *, layers: Sequence[int] | None = None, heads: Sequence[int] | None = None
           ) -> Iterator[Recording]:
    """Capture the exact attention weights of the chosen heads of the chosen attention modules only
    (indices into :func:`attention_modules`; all when None), while every output stays on attnkit's
    fast path: a head's weights cost that head's (B, 1, L, S), not the whole layer's.

        with attnkit.hf.record(model, layers=[3], heads=[5]) as rec:
            model(**inputs)
        rec.weights  # {"model.layers.3.self_attn": [tensor (B, 1, L, S)]}
    """
    modules = attention_modules(model)
    if getattr(model.config, "_attn_implementation", None) != IMPLEMENTATION:
        raise ValueError(f"record() needs a model loaded with attn_implementation={IMPLEMENTATION!r}, this one uses "
                         f"{getattr(model.config, '_attn_implementation', None)!r}")
    chosen = range(len(modules)) if layers is None else list(layers)
    bad = [i for i in chosen if not (isinstance(i, int) and 0 <= i < len(modules))]
    if bad:
        raise ValueError(f"layers must index the model's {len(modules)} attention modules, got {bad}")
    head_list = None if heads is None else [int(h) for h in heads]
    selected = {id(modules[i][1]): head_list for i in chosen}
    recording = Recording(heads={k: (v if v is not None else _all_heads(modules, k)) for k, v in selected.items()},
                          names={id(m): name for name, m in modules})
    global _open
    with _open_lock:
        _open += 1
    token = RECORDING.set(recording)
    try:
        yield recording
    finally:
        RECORDING.reset(token)
        with _open_lock:
            _open -= 1


def _all_heads(modules, module_id: int) -> list[int]:
    module = next(m for _, m in modules if id(m) == module_id)
    config = getattr(module, "config", None)
    count = getattr(module, "num_heads", None) or getattr(config, "num_attention_heads", None)
    if count is None:
        raise ValueError(f"cannot tell how many heads {type(module).__name__} has; pass heads=[...]")
    return list(range(int(count)))
