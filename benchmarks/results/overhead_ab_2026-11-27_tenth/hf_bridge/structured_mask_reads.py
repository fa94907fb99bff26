"""Reads of a StructuredMask (a Tensor subclass: every Tensor attribute goes through ``__torch_function__``), each
alone in a loop, best of five repeats of 20,000: what the bridge read on every layer call before this session
(``shape``, ``as_subclass(Tensor)``) and what it reads now (``keys``, ``padding``).

    PYTHONPATH=src python benchmarks/results/overhead_ab_2026-11-27_tenth/hf_bridge/structured_mask_reads.py
"""

import timeit

import torch

from attnkit.hf.masks import _Structure, _structured

mask = _structured(torch.ones(1, 1, 1, 16, dtype=torch.bool), _Structure(True, None, "top-left", True))
reads = {
    "mask.shape[-1]": lambda: mask.shape[-1],
    "mask.as_subclass(torch.Tensor)": lambda: mask.as_subclass(torch.Tensor),
    "mask.keys": lambda: mask.keys,
    "mask.padding": lambda: mask.padding,
    "mask.structure": lambda: mask.structure,
}
for name, read in reads.items():
    print(f"{name:32s} {min(timeit.repeat(read, number=20_000, repeat=5)) / 20_000 * 1e6:6.3f} us")
