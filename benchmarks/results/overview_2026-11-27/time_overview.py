"""Seconds viz.plot_overview takes to write a 30-layer, 9-head overview (SmolLM2's shape, 14 tokens) to a PNG;
argv[1] labels the line (before / after), argv[2] the PNG's path."""

import sys
import time

import torch

import attnkit
from attnkit.viz import plot_overview

attentions = torch.rand(30, 9, 14, 14, generator=torch.Generator().manual_seed(0))
start = time.perf_counter()
plot_overview(attentions, sys.argv[2], title="30 layers x 9 heads")
print(f"{sys.argv[1]:6s} plot_overview, 30 layers x 9 heads, to PNG: {time.perf_counter() - start:5.2f} s  "
      f"(attnkit from {attnkit.__file__.split('/src/')[0]})")
