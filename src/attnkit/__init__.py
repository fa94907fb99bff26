"""attnkit: attention mechanisms, implemented once, correctly, fast and inspectable.

Shape legend (used in every public docstring):

    B    batch size
    H    query heads
    Hkv  key/value heads (H % Hkv == 0: MHA if equal, GQA in between, MQA if 1)
    L    query (target) length
    S    key/value (source) length
    E    head dim of queries and keys
    Ev   head dim of values
    D    model dim

The functional core takes (B, H, L, E); the layers take (B, L, D) (batch first).
Masks are boolean and True means "may attend".
"""

from . import functional, layers, masks, scores
from .functional import AttentionOutput, attend, attention, masked_softmax, nan_rule, scaled_dot_product_attention
from .layers import (
    BahdanauAttention,
    KVCache,
    LuongAttention,
    MultiHeadAttention,
    SelfAttention,
)

__version__ = "0.1.0"

__all__ = [
    "functional",
    "layers",
    "masks",
    "scores",
    "attention",
    "scaled_dot_product_attention",
    "attend",
    "AttentionOutput",
    "masked_softmax",
    "nan_rule",
    "BahdanauAttention",
    "LuongAttention",
    "SelfAttention",
    "MultiHeadAttention",
    "KVCache",
    "__version__",
]
