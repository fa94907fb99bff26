#!/usr/bin/env bash
# The GPU record (issue 63) in one prepared call on the lent device: every step under its own time cap,
# writing under $OUT as it goes, so that a run cut short still returns what it finished. Eight files
# come back (the device tool's most): log.txt (every step's output, the versions), core_4k.json,
# core_long.json, overhead.json, generation.json, generation_compiled.json, latent.json, profiles.tgz.
#
#   ATTNKIT_COMMIT=$(git rev-parse HEAD) bash scripts/gpu_record.sh      # on the device, repository root
#
# Steps (caps in seconds, 505 in all; most steps end well before their cap):
#   1 tests/gpu (8 workers; --maxfail 10 rather than -x: one run shows every failure it can)      170
#   2 the core, bf16, NaN rule on, H 32, E 128: dense and causal auto against SDPA at 4K (B 8),
#     16K and 64K (B 1); window 1024 and Longformer against compiled flex at 16K and 64K            35 + 100
#     the per-call cases of benchmarks/overhead.py on CUDA                                         25
#   3 decoding: DecoderLM (Llama-shaped, bf16) against transformers sdpa and eager, then static
#     cache + compile against attnkit's compile_step, batch 1 and 16                              30 + 75
#   4 MLA absorbed decoding against DeepseekV3Attention at 4K-32K; DSA against dense at 16K-64K     45
#   5 a torch.profiler trace of the worst missed core cells                                        25
set -u
OUT=${OUT:-out/gpu_record}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONWARNINGS=ignore::FutureWarning
LOG="$OUT/log.txt"
PY=${PYTHON:-python3}

step() {  # step CAP NAME COMMAND...: the command under a time cap, its output into the log
    local cap=$1 name=$2
    shift 2
    local started=$SECONDS
    echo "=== $name (cap ${cap} s) at $(date +%T)" >>"$LOG"
    timeout -k 10 "$cap" "$@" >>"$LOG" 2>&1
    local status=$?
    echo "=== $name: exit $status after $((SECONDS - started)) s" | tee -a "$LOG"
}

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    $PY -c "import sys, torch, triton, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, \
'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__)"
    echo "commit ${ATTNKIT_COMMIT:-unknown}"
} >>"$LOG" 2>&1

step 170 "1 tests/gpu" $PY -m pytest tests/gpu -q -n 8 --maxfail 10 -p no:cacheprovider
step 35 "2a core 4K, B 8" $PY benchmarks/gpu.py --sizes 4096 --batch 8 --heads 32 --patterns dense causal \
    --mask-sizes --repeats 10 --out "$OUT/core_4k.json"
step 100 "2b core 16K-64K, B 1" $PY benchmarks/gpu.py --sizes 16384 65536 --batch 1 --heads 32 --mask-sizes \
    --repeats 10 --long-repeats 3 --out "$OUT/core_long.json"
step 25 "2c per call" $PY benchmarks/overhead.py --device cuda --calls 300 --rounds 3 --out "$OUT/overhead.json"
step 30 "3a decoding" $PY benchmarks/gpu_generation.py --dtypes bfloat16 --batches 1 16 --new-tokens 64 --repeats 2 \
    --rows hf-eager attnkit --out "$OUT/generation.json"
step 75 "3b decoding, compiled" $PY benchmarks/gpu_generation.py --dtypes bfloat16 --batches 1 16 --new-tokens 64 \
    --repeats 2 --rows hf-static attnkit-compiled --out "$OUT/generation_compiled.json"
step 45 "4 MLA and DSA" $PY benchmarks/gpu_latent.py --repeats 10 --out "$OUT/latent.json"
echo "=== 4 gated delta rule against flash-linear-attention: not run (no gated_delta_rule in attnkit yet)" | tee -a "$LOG"
step 25 "5 profiles" $PY benchmarks/gpu_profile.py "$OUT/core_4k.json" "$OUT/core_long.json" --cases 3 \
    --out "$OUT/profiles"
tar -czf "$OUT/profiles.tgz" -C "$OUT" profiles && rm -rf "$OUT/profiles"
grep -E "^\| |MLA decode|DSA n=|passed|failed|error" "$LOG" | tail -n 120
