#!/usr/bin/env bash
# Issue 62 on CUDA, the packed q/k/v projection (eaed1b7) in one prepared call on the lent device, each step under
# its own time cap and writing under $OUT as it goes (at most eight files come back):
#   1. tests/gpu (8 workers), with tests/gpu/test_packed_cuda.py, the packed path's first run on a GPU;
#   2. benchmarks/overhead.py --device cuda on this code and on BEFORE (a copy of the code before the packing,
#      carried as an ignored folder: BEFORE=.gpu_before/src), one process each, this code first;
#   3. benchmarks/gpu_harness_gap.py: why gpu.py and gpu_nan_rule.py timed the 4K, B 8 causal call 0.2 ms apart,
#      then gpu.py's own row of that call (fwd, 3 rounds) beside it;
#   4. benchmarks/gpu_generation.py, bf16 at batch 1 (where the host decides), this code and BEFORE.
#
#   ATTNKIT_COMMIT=$(git rev-parse --short HEAD) BEFORE=.gpu_before/src bash scripts/gpu_packed.sh
set -u
OUT=${OUT:-out/gpu_packed}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONWARNINGS=ignore
LOG="$OUT/log.txt"
step() {  # step CAP NAME SRC COMMAND...: the command with PYTHONPATH=SRC under a time cap, its output into the log
    local cap=$1 name=$2 src=$3 started=$SECONDS
    shift 3
    echo "=== $name (PYTHONPATH=$src, cap $cap s) at $(date +%T)" >>"$LOG"
    PYTHONPATH=$src timeout -k 5 "$cap" "$@" >>"$LOG" 2>&1
    echo "=== $name: exit $? after $((SECONDS - started)) s" | tee -a "$LOG"
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import sys, torch, triton, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__)"
  echo "commit ${ATTNKIT_COMMIT:-unknown}; before: ${BEFORE:-none}"; } >>"$LOG" 2>&1
step 150 "1 tests/gpu" src python3 -m pytest tests/gpu -q -n 8 --maxfail 10 -p no:cacheprovider
step 45 "2a overhead, this code" src python3 benchmarks/overhead.py --device cuda --calls 200 --rounds 3 \
    --out "$OUT/overhead_after.json"
[ -n "${BEFORE:-}" ] && step 45 "2b overhead, before" "$BEFORE" python3 benchmarks/overhead.py --device cuda --calls 200 \
    --rounds 3 --out "$OUT/overhead_before.json"
step 40 "3a harness gap" src python3 benchmarks/gpu_harness_gap.py --out "$OUT/harness_gap.json"
step 40 "3b gpu.py 4K B 8 causal fwd" src python3 benchmarks/gpu.py --sizes 4096 --batch 8 --heads 32 --patterns causal \
    --modes fwd --mask-sizes --repeats 10 --rounds 3 --out "$OUT/core_4k.json"
step 60 "4a generation, this code" src python3 benchmarks/gpu_generation.py --dtypes bfloat16 --batches 1 \
    --new-tokens 64 --repeats 2 --rows attnkit --out "$OUT/generation_after.json"
[ -n "${BEFORE:-}" ] && step 60 "4b generation, before" "$BEFORE" python3 benchmarks/gpu_generation.py --dtypes bfloat16 \
    --batches 1 --new-tokens 64 --repeats 2 --rows attnkit --out "$OUT/generation_before.json"
grep -E "passed|failed|tok/s|^\| |^(dense|causal|decode|MultiHead|DecoderLM|padding|window|BlockMask|prefill|score|sinks)" "$LOG" | head -80
