#!/usr/bin/env bash
# The thirteenth session's one prepared call on the lent device (issue 62 on CUDA after the tenth to twelfth
# sessions, which no GPU saw), each step under its own time cap, writing under $OUT as it goes. Eight files come back:
# log.txt, overhead_{before,after}_{1,2}.json, nan_kernel_sizes.json, core_4k.json, core_16k.json.
#   1. benchmarks/overhead.py --device cuda, alternating the ninth session's last measured code (fc6814c's src under
#      ab_base/, git-ignored, carried) and this tree's, twice each: the per-call cases on CUDA;
#   2. benchmarks/gpu_nan_kernel_sizes.py: the NaN rule's one kernel against its seven kernels and the look, device
#      time at the sizes PROGRAM_MAX_BYTES bounds (called unmeasured in nan_kernel's docstring);
#   3. benchmarks/gpu.py, bf16 causal forward against SDPA at 4K (B 8, H 32) and 16K (B 1): the issue's 4K-16K row;
#   4. tests/gpu (8 workers), tests/gpu/test_one_graph_cuda.py among them (export, compile, vmap, CUDA graphs on
#      CUDA), with Captum and num2words from wheels under .whl/ (carried).
# About 5 minutes:
#
#   rm -rf ab_base && mkdir ab_base && git archive fc6814c src | tar -x -C ab_base
#   ATTNKIT_COMMIT=$(git rev-parse --short HEAD) bash scripts/gpu_thirteenth.sh     # carry: ab_base, .whl
set -u
OUT=${OUT:-out/gpu_thirteenth}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONWARNINGS=ignore
LOG="$OUT/log.txt"
source "$(dirname "$0")/gpu_steps.sh"
with_wheels
record_machine
overhead_ab " (fc6814c)"
step 60 "2 NaN rule's kernel by size" python3 benchmarks/gpu_nan_kernel_sizes.py --out "$OUT/nan_kernel_sizes.json"
step 45 "3a core 4K B 8 causal fwd" python3 benchmarks/gpu.py --sizes 4096 --batch 8 --heads 32 --patterns causal \
    --modes fwd --mask-sizes --repeats 10 --rounds 3 --out "$OUT/core_4k.json"
step 45 "3b core 16K causal fwd" python3 benchmarks/gpu.py --sizes 16384 --patterns causal --modes fwd --mask-sizes \
    --repeats 10 --rounds 3 --out "$OUT/core_16k.json"
step 230 "4 tests/gpu" python3 -m pytest tests/gpu -q -n 8 --maxfail 25 -p no:cacheprovider -rfE
grep -E "passed|failed|^(dense|causal|decode|MultiHead|DecoderLM|padding|window|BlockMask|prefill|score|sinks)|^=== |^\| |^FAILED|^ERROR" "$LOG" | head -120
