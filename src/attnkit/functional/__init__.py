"""The functional core: pure functions on tensors, no parameters.

Masks have one public home, :mod:`attnkit.masks`; :mod:`attnkit.functional.masks` is its
implementation, not re-exported here.

Every mechanism is three steps: score (:mod:`.scores`), normalise (:mod:`.softmax`), combine;
:func:`attention` runs all three for scaled dot-product attention with a choice of backends.
"""

from . import scores
from .attention import BACKEND_NAMES, AttentionOutput, attend, attention, choose_backend
from .heads import merge_heads, split_heads
from .nan import nan_rule
from .sdpa_api import scaled_dot_product_attention
from .softmax import masked_logsumexp, masked_softmax

__all__ = [
    "scores",
    "attention",
    "scaled_dot_product_attention",
    "attend",
    "AttentionOutput",
    "BACKEND_NAMES",
    "choose_backend",
    "nan_rule",
    "masked_softmax",
    "masked_logsumexp",
    "split_heads",
    "merge_heads",
]
