"""Seconds one load_gguf_for_inspection(SmolLM2) takes; argv[1] labels the line (before / after)."""

import sys
import time

import torch
import transformers

import attnkit
from attnkit.inspect.hf_models import load_gguf_for_inspection
from attnkit.models.pretrained import smollm2_gguf

start = time.perf_counter()
load_gguf_for_inspection(smollm2_gguf())
seconds = time.perf_counter() - start
print(f"{sys.argv[1]:6s} load_gguf_for_inspection(SmolLM2-135M Q4_1): {seconds:6.2f} s  (attnkit from "
      f"{attnkit.__file__.split('/src/')[0]}, transformers {transformers.__version__}, torch {torch.__version__}, "
      f"{torch.get_num_threads()} threads)")
