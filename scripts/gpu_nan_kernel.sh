#!/usr/bin/env bash
# The NaN rule's one Triton kernel (src/attnkit/functional/nan_kernel.py) on the lent device, in one prepared call:
#   1. benchmarks/overhead.py --device cuda, alternating the code before the kernel (a copy of the previous commit's
#      src under ab_base/, git-ignored, carried) and this tree's, twice each: the per-call cases on CUDA;
#   2. tests/gpu (8 workers), the kernel's own tests among them, with Captum and num2words from wheels under .whl/
#      (carried; the device's image lacks them: the first run's four failures were those imports).
# At most eight files come back: log.txt and the four overhead JSON files. About 4 minutes (2.5 with TESTS=...):
#
#   rm -rf ab_base && mkdir ab_base && git archive HEAD~1 src | tar -x -C ab_base   # the code before
#   ATTNKIT_COMMIT=$(git rev-parse --short HEAD) bash scripts/gpu_nan_kernel.sh     # carry: ab_base, .whl
set -u
OUT=${OUT:-out/gpu_nan_kernel}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONWARNINGS=ignore
LOG="$OUT/log.txt"
source "$(dirname "$0")/gpu_steps.sh"
with_wheels
record_machine
# TESTS=tests/gpu/test_nan_rule_cuda.py runs only the rule's tests, first (a change to the launch alone: its ninth
# session's second look, at Triton's kept-kernel launch, nan_kernel.FAST_LAUNCH)
TESTS=${TESTS:-}
if [ -n "$TESTS" ]; then
    step 90 "0 $TESTS" python3 -m pytest "$TESTS" -q -n 8 -p no:cacheprovider
fi
overhead_ab ""
if [ -z "$TESTS" ]; then
    step 200 "2 tests/gpu" python3 -m pytest tests/gpu -q -n 8 --maxfail 20 -p no:cacheprovider
fi
grep -E "passed|failed|^(dense|causal|decode|MultiHead|DecoderLM|padding|window|BlockMask|prefill|score|sinks)|^=== " "$LOG" | head -80
