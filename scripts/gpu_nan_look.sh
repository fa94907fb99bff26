#!/usr/bin/env bash
# Issue 62, the NaN rule's look on CUDA: the GPU tests of the rule, then benchmarks/overhead.py (tiny calls, a
# DecoderLM step) and benchmarks/gpu_generation.py (bf16 generate, batch 1 and 16) with nan.DEVICE_LOOK_MIN_BYTES
# set to each of LOOKS in turn (default "inf 0": never looking first, and every call; "default": as shipped), in
# one call on the device. The record of 2026-11-27 ran LOOKS="default 0" when the shipped value was 32 MiB.
set -u
OUT=${OUT:-out/gpu_nan_look}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONWARNINGS=ignore
LOG="$OUT/log.txt"
with() {  # with BYTES SCRIPT ARGS...: run a benchmark with nan.DEVICE_LOOK_MIN_BYTES set to BYTES (default: as shipped)
    local bytes=$1 script=$2
    shift 2
    python3 -c "import runpy, sys
from attnkit.functional import nan
if '$bytes' != 'default': nan.DEVICE_LOOK_MIN_BYTES = float('$bytes')
print('DEVICE_LOOK_MIN_BYTES', nan.DEVICE_LOOK_MIN_BYTES)
sys.argv = ['$script', *sys.argv[1:]]
runpy.run_path('$script', run_name='__main__')" "$@"
}
source "$(dirname "$0")/gpu_steps.sh"
record_machine
export -f with  # timeout runs programs, not shell functions: bash -c runs it
[ -z "${SKIP_TESTS:-}" ] && step 60 "tests" python3 -m pytest tests/gpu/test_nan_rule_cuda.py -q -n 4 -p no:cacheprovider
for bytes in ${LOOKS:-inf 0}; do
    step 45 "overhead, look from $bytes" bash -c 'with "$@"' with $bytes benchmarks/overhead.py --device cuda --calls 200 --rounds 3 --out "$OUT/overhead_$bytes.json"
done
for bytes in ${LOOKS:-inf 0}; do
    step 60 "generation, look from $bytes" bash -c 'with "$@"' with $bytes benchmarks/gpu_generation.py --dtypes bfloat16 --batches 1 16 \
        --new-tokens 64 --repeats 2 --rows attnkit --out "$OUT/generation_$bytes.json"
done
grep -E "passed|failed|DEVICE_LOOK|tok/s|^(dense|causal|decode|MultiHead|DecoderLM|padding|window|BlockMask|prefill)" "$LOG"
