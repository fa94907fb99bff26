"""The dtypes arithmetic runs in, whatever the inputs' dtype: one rule for the backends, the linear family, the
layers, the models and context parallelism."""

from __future__ import annotations

import torch

__all__ = ["compute_dtype", "accumulation_dtype"]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a softmax's scores are computed in: float32 for half types, the input dtype otherwise."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 and float32 for every other dtype: the dtype of sums, states and log-sum-exps
    kept across blocks, tokens or ranks (a float8 input too accumulates in float32)."""
    return torch.float64 if dtype == torch.float64 else torch.float32
