#!/usr/bin/env bash
# The GPU record (issue 63) in one prepared call on the lent device: every step under its own time cap,
# writing under $OUT as it goes, so that a run cut short still returns what it finished. At most eight files
# come back (the device tool's most): choose STEPS so that at most eight are written: log.txt (every step's
# output, the versions), core_4k.json, core_16k.json, core_long.json, core_structured.json, nan_rule.json,
# overhead.json, generation.json, latent.json, profiles.tgz.
#
#   ATTNKIT_COMMIT=$(git rev-parse HEAD) bash scripts/gpu_record.sh      # on the device, repository root
#   STEPS="2a 2b" TESTS="tests/gpu/test_hf_cuda.py" bash scripts/gpu_record.sh   # a rerun of some steps
#
# Steps (caps in seconds; most end well before their cap). A whole run is more than one call of 8 minutes:
# STEPS picks (the second session of 2026-11-26 ran STEPS="1 6 4b 2d 3b 2e 5b", what the first left unmeasured):
#   1  tests/gpu (8 workers; --maxfail 10 rather than -x: one run shows every failure it can)       170
#   2a/2b the core, bf16, NaN rule on, H 32, E 128: dense and causal auto against SDPA at 4K (B 8),
#      16K and 64K (B 1)                                                                       35 + 45
#   2f the core at 16K alone (B 1), dense and causal                                                35
#   7  the NaN rule by size, looking first or not (benchmarks/gpu_nan_rule.py: DEVICE_LOOK_MIN_BYTES)  100
#   2c the per-call cases of benchmarks/overhead.py on CUDA                                         30
#   4  MLA absorbed decoding against DeepseekV3Attention at 4K-32K; DSA against dense at 16K-32K     45
#   4b DSA against dense at 64K                                                                     45
#   6  the gated delta rule against flash-linear-attention's chunk_gated_delta_rule (fla-core,
#      carried as a wheel), transformers' torch function and causal SDPA, 4K-64K                    75
#   5  a torch.profiler trace of the worst missed dense and causal cells                            20
#   3  decoding: DecoderLM (Llama-shaped, bf16) against transformers sdpa and eager, then static
#      cache + compile against attnkit's compile_step, batch 1 and 16                              105
#   3b the compiled decoding rows alone at batch 16                                                120
#   2d window 1024 and Longformer against compiled flex at 16K (B 1), forward and backward         110
#   2e the same at 64K, forward only (each backward is a compile of its own)                        60
#   5b a torch.profiler trace of the worst missed window and Longformer cells                       30
set -u
OUT=${OUT:-out/gpu_record}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONWARNINGS=ignore::FutureWarning
LOG="$OUT/log.txt"
PY=${PYTHON:-python3}
# Python packages the device's image lacks (num2words, captum), carried as wheels in .whl/ (the device
# tool's README says how): installed beside the image's own.
if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=src:/tmp/site
fi

step() {  # step CAP NAME COMMAND...: the command under a time cap, its output into the log
    local cap=$1 name=$2
    shift 2
    if [ -n "${STEPS:-}" ] && [[ " $STEPS " != *" ${name%% *} "* ]]; then
        return 0  # STEPS="2a 2b ..." reruns only those steps
    fi
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

step 170 "1 tests/gpu" $PY -m pytest ${TESTS:-tests/gpu} -q -n 8 --maxfail 10 -p no:cacheprovider
step 35 "2a core 4K, B 8" $PY benchmarks/gpu.py --sizes 4096 --batch 8 --heads 32 --patterns dense causal \
    --mask-sizes --repeats 10 --out "$OUT/core_4k.json"
step 45 "2b core 16K-64K, B 1" $PY benchmarks/gpu.py --sizes 16384 65536 --batch 1 --heads 32 --patterns dense causal \
    --mask-sizes --repeats 10 --long-repeats 3 --out "$OUT/core_long.json"
step 35 "2f core 16K, B 1" $PY benchmarks/gpu.py --sizes 16384 --batch 1 --heads 32 --patterns dense causal \
    --mask-sizes --repeats 10 --out "$OUT/core_16k.json"
step 100 "7 NaN rule by size" $PY benchmarks/gpu_nan_rule.py --out "$OUT/nan_rule.json"
step 30 "2c per call" $PY benchmarks/overhead.py --device cuda --calls 200 --rounds 3 --out "$OUT/overhead.json"
step 45 "4 MLA and DSA" $PY benchmarks/gpu_latent.py --repeats 10 --dsa-sizes 16384 32768 --dsa-repeats 2 \
    --out "$OUT/latent.json"
step 45 "4b DSA 64K" $PY benchmarks/gpu_latent.py --mla-sizes --dsa-sizes 65536 --dsa-repeats 2 --out "$OUT/dsa_64k.json"
step 75 "6 gated delta rule" $PY benchmarks/gpu_linear.py --sizes 4096 16384 65536 --repeats 5 --out "$OUT/linear.json"
step 20 "5 profiles" $PY benchmarks/gpu_profile.py "$OUT/core_4k.json" "$OUT/core_long.json" --cases 2 \
    --out "$OUT/profiles"
[ -d "$OUT/profiles" ] && tar -czf "$OUT/profiles.tgz" -C "$OUT" profiles && rm -rf "$OUT/profiles"
step 105 "3 decoding" $PY benchmarks/gpu_generation.py --dtypes bfloat16 --batches 1 16 --new-tokens 64 --repeats 2 \
    --rows hf-eager attnkit hf-static attnkit-compiled --out "$OUT/generation.json"
step 120 "3b decoding, compiled, batch 16" $PY benchmarks/gpu_generation.py --dtypes bfloat16 --batches 16 \
    --new-tokens 64 --repeats 2 --rows hf-static attnkit-compiled --out "$OUT/generation_compiled.json"
step 110 "2d structured 16K, B 1" $PY benchmarks/gpu.py --sizes 16384 --batch 1 --heads 32 \
    --patterns window longformer --mask-sizes --repeats 10 --out "$OUT/core_structured.json"
step 60 "2e structured 64K, B 1, forward" $PY benchmarks/gpu.py --sizes 65536 --batch 1 --heads 32 --modes fwd \
    --patterns window longformer --mask-sizes --repeats 3 --out "$OUT/core_structured_64k.json"
step 30 "5b profiles, structured" $PY benchmarks/gpu_profile.py "$OUT/core_structured.json" \
    "$OUT/core_structured_64k.json" --cases 1 --out "$OUT/profiles"
[ -d "$OUT/profiles" ] && tar -czf "$OUT/profiles.tgz" -C "$OUT" profiles && rm -rf "$OUT/profiles"
grep -E "^\| |MLA decode|DSA n=|passed|failed|error|tok/s" "$LOG" | tail -n 150
