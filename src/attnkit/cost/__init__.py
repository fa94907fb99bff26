"""What a model costs, from its config alone: a Transformer's parameters, FLOPs, attention matrix and KV cache
(:mod:`.transformer`), and what a hybrid of linear and softmax attention holds while it decodes (:mod:`.hybrid`)."""

from .hybrid import HYBRID_MODEL_TYPES, HYBRID_PRESETS, HybridMemory, HybridShape, hybrid_memory, shape_from_hf
from .transformer import (
    DTYPE_BYTES,
    PATTERN_OPTIONS,
    Cost,
    bytes_text,
    estimate,
    flops_text,
    parameter_breakdown,
    pattern_pairs,
)

__all__ = ["Cost", "parameter_breakdown", "estimate", "pattern_pairs", "PATTERN_OPTIONS", "DTYPE_BYTES", "bytes_text",
           "flops_text", "HybridShape", "HybridMemory", "HYBRID_PRESETS", "HYBRID_MODEL_TYPES", "hybrid_memory",
           "shape_from_hf"]
