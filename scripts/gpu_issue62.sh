#!/usr/bin/env bash
# Issue 62 on CUDA in one prepared call on the lent device (what the sixth and seventh sessions, without a GPU, left
# unmeasured), each step under its own time cap and writing under $OUT as it goes (at most eight files come back:
# log.txt, overhead.json, hybrid_bf16.json, hybrid_fp32.json, core_4k.json, core_16k.json):
#   1. tests/gpu (8 workers): the packed projection's shared-base look, the one-token rule, the convolution step and
#      one token's experts run on CUDA for the first time through the model tests there;
#   2. benchmarks/overhead.py --device cuda: the per-call cases against SDPA, nn.MultiheadAttention, plain torch;
#   3. benchmarks/hybrid_decode.py on the device, bf16 then float32: a hybrid model's decoding step (Qwen3-Next,
#      Kimi Linear, MiniMax-01) against transformers' own;
#   4. benchmarks/gpu.py, bf16 causal forward against SDPA at 4K (B 8, H 32) and 16K (B 1): the issue's 4K-16K row.
# About 6 minutes of a 10-minute call; run from the repository root with the code at src (no install):
#
#   ATTNKIT_COMMIT=$(git rev-parse --short HEAD) bash scripts/gpu_issue62.sh
set -u
OUT=${OUT:-out/gpu_issue62}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONWARNINGS=ignore PYTHONPATH=src
LOG="$OUT/log.txt"
source "$(dirname "$0")/gpu_steps.sh"
# Captum and num2words, which the device's image lacks (four tests failed without them in the ninth session's first
# call), from wheels under .whl/ (git-ignored; carry it): `pip download --no-deps --only-binary=:all:
# --python-version 3.12 -d .whl captum num2words` here first
with_wheels
record_machine
step 170 "1 tests/gpu" python3 -m pytest tests/gpu -q -n 8 --maxfail 10 -p no:cacheprovider
step 60 "2 overhead" python3 benchmarks/overhead.py --device cuda --calls 200 --rounds 3 --out "$OUT/overhead.json"
step 75 "3a hybrid step, bf16" python3 benchmarks/hybrid_decode.py --device cuda --dtype bfloat16 --runs 3 \
    --out "$OUT/hybrid_bf16.json"
step 75 "3b hybrid step, float32" python3 benchmarks/hybrid_decode.py --device cuda --dtype float32 --runs 3 \
    --out "$OUT/hybrid_fp32.json"
step 45 "4a core 4K B 8 causal fwd" python3 benchmarks/gpu.py --sizes 4096 --batch 8 --heads 32 --patterns causal \
    --modes fwd --mask-sizes --repeats 10 --rounds 3 --out "$OUT/core_4k.json"
step 45 "4b core 16K causal fwd" python3 benchmarks/gpu.py --sizes 16384 --patterns causal --modes fwd --mask-sizes \
    --repeats 10 --rounds 3 --out "$OUT/core_16k.json"
grep -E "passed|failed|attnkit .* ms|^\| |^(dense|causal|decode|MultiHead|DecoderLM|padding|window|BlockMask|prefill|score|sinks)" "$LOG" | head -80
