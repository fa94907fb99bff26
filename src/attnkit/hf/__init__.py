"""attnkit inside Hugging Face transformers: ``"attnkit"`` as an attention implementation.

    import attnkit.hf
    attnkit.hf.register()
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="attnkit")

Every attention call of a model whose family routes attention through transformers'
``AttentionInterface`` then runs :func:`attnkit.attention` (``backend="auto"``), with eager's
numbers or a refusal by name, never a third outcome:

- :mod:`.interface`: the attention function and :func:`register`; rows with no allowed key follow
  eager (:mod:`.rows`);
- :mod:`.masks`: the mask function, which passes structure plus padding as :class:`StructuredMask`
  where it has proved that is the whole mask, else transformers' own mask unchanged;
- :mod:`.families`: :data:`VERIFIED_FAMILIES` and the guard on every route to ``"attnkit"``
  (construction, ``from_pretrained``, ``set_attn_implementation`` with a string or a dict, the
  sub-models of composites, the call itself); importing this package installs it, so that
  ``attn_implementation="attnkit"`` before :func:`register` says to call it;
- :mod:`.record`: exact weights of chosen heads while the outputs stay on the fast path;
- :mod:`.parallel`: :func:`context_parallel`, one sequence split across processes (ring or Ulysses).

Requires the ``hf`` extra (transformers).
"""

from __future__ import annotations

from .families import (
    IMPLEMENTATION,
    VERIFIED_FAMILIES,
    UnsupportedFeature,
    UnverifiedFamily,
    UnverifiedFamilyWarning,
    check_family,
    install_guard,
)
from .interface import attnkit_attention_forward, register
from .masks import StructuredMask, attnkit_mask
from .parallel import CONTEXT_PARALLEL_FAMILIES, HFContextParallel, context_parallel
from .record import Recording, attention_modules, record

__all__ = ["IMPLEMENTATION", "VERIFIED_FAMILIES", "register", "check_family", "UnverifiedFamily",
           "UnverifiedFamilyWarning", "StructuredMask", "attnkit_attention_forward", "attnkit_mask", "record",
           "Recording", "attention_modules", "UnsupportedFeature", "context_parallel", "HFContextParallel",
           "CONTEXT_PARALLEL_FAMILIES"]

try:  # the guard, so that "attnkit" before register() is refused with what to do
    install_guard()
except ImportError:  # no transformers: register() says so when called
    pass
