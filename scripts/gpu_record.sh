#!/usr/bin/env bash
# The GPU record in one prepared call on a lent device: every step under its own time cap, writing under $OUT as it
# goes, so that a run cut short returns what it finished and STEPS="..." re-runs what did not. About 8 minutes in
# all. attnkit runs from src/ (PYTHONPATH), with the NaN rule off (its default) unless a step says "rule on".
#
#   ATTNKIT_COMMIT=$(git rev-parse --short HEAD) bash scripts/gpu_record.sh      # on the device, repository root
#   STEPS="2 4" bash scripts/gpu_record.sh                                          # some steps again
#
# Steps (caps in seconds):
#   1  tests/gpu whole (8 workers): passed / failed / skipped                                       110
#   2  auto against SDPA, bf16, H 32, E 128, 4K (B 8): forward and forward + backward, rule off and on  70
#   3  the same at 16K and 64K (B 1), rule off                                                        45
#   4  window 1024 and Longformer against compiled flex at 16K (forward and backward), 64K forward  105
#   5  tiny calls on CUDA against SDPA (benchmarks/overhead.py --device cuda; the rule-on column)      30
#   6  decoding against transformers (Llama-shaped, bf16), uncompiled and compiled, batch 1 and 16     90
#   7  the linear core against flash-linear-attention, 4K-64K: the dispatch (backend "auto") and the  60
#      chunked form against fla's own call (fla-core's wheel carried in .whl/: before the call, here,
#      pip download --no-deps -d .whl fla-core==0.6.0 einops)
set -u
OUT=${OUT:-out/gpu_record}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONWARNINGS=ignore::FutureWarning
LOG="$OUT/log.txt"
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then  # packages the device's image lacks, carried as wheels in .whl/
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=src:/tmp/site
fi

step() {  # step CAP NAME COMMAND...: the command under a time cap, its output into the log
    local cap=$1 name=$2
    shift 2
    if [ -n "${STEPS:-}" ] && [[ " $STEPS " != *" ${name%% *} "* ]]; then
        return 0
    fi
    local started=$SECONDS
    echo "=== $name (cap ${cap} s) at $(date +%T)" >>"$LOG"
    timeout -k 10 "$cap" "$@" >>"$LOG" 2>&1
    echo "=== $name: exit $? after $((SECONDS - started)) s" | tee -a "$LOG"
}

{   # the card, the driver and the versions measured, once
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    $PY -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, \
'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
    $PY -c "import triton; print('triton', triton.__version__)" || echo "triton: none"
    echo "commit ${ATTNKIT_COMMIT:-unknown}"
} >>"$LOG" 2>&1

CORE="benchmarks/gpu.py --heads 32 --patterns dense causal --mask-sizes --repeats 10"
step 110 "1 tests/gpu" $PY -m pytest tests/gpu -q -n 8 --maxfail 20 -p no:cacheprovider
step 35 "2 core 4K, B 8, rule off" $PY $CORE --sizes 4096 --batch 8 --out "$OUT/core_4k.json"
step 35 "2 core 4K, B 8, rule on" $PY $CORE --sizes 4096 --batch 8 --nan-rule on --out "$OUT/core_4k_rule_on.json"
step 45 "3 core 16K-64K, B 1" $PY $CORE --sizes 16384 65536 --batch 1 --long-repeats 3 --out "$OUT/core_long.json"
step 60 "4 structured 16K" $PY benchmarks/gpu.py --sizes 16384 --batch 1 --heads 32 --patterns window longformer \
    --mask-sizes --repeats 10 --out "$OUT/core_structured.json"
step 45 "4 structured 64K, forward" $PY benchmarks/gpu.py --sizes 65536 --batch 1 --heads 32 --modes fwd \
    --patterns window longformer --mask-sizes --repeats 3 --out "$OUT/core_structured_64k.json"
step 30 "5 per call" $PY benchmarks/overhead.py --device cuda --calls 200 --rounds 3 --out "$OUT/overhead.json"
step 90 "6 decoding" $PY benchmarks/gpu_generation.py --dtypes bfloat16 --batches 1 16 --new-tokens 64 --repeats 2 \
    --rows hf-eager attnkit hf-static attnkit-compiled --out "$OUT/generation.json"
step 60 "7 linear core" $PY benchmarks/gpu_linear.py --sizes 4096 16384 65536 --repeats 3 --out "$OUT/linear.json"
grep -E "^\| |passed|failed|error|tok/s" "$LOG" | tail -n 120
