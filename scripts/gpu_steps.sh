# Shared by the prepared GPU scripts (source it after setting LOG): each step under its own time cap, its output
# into the log, and the machine's facts at the top of the log.
step() {  # step CAP NAME COMMAND...: the command under a time cap, its output into $LOG, its exit and seconds shown
    local cap=$1 name=$2 started=$SECONDS
    shift 2
    echo "=== $name (cap $cap s) at $(date +%T)" >>"$LOG"
    timeout -k 5 "$cap" "$@" >>"$LOG" 2>&1
    echo "=== $name: exit $? after $((SECONDS - started)) s" | tee -a "$LOG"
}
record_machine() {  # the GPU, the driver, the versions and the commit measured, into $LOG
    { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
      python3 -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
      python3 -c "import triton; print('triton', triton.__version__)"
      echo "commit ${ATTNKIT_COMMIT:-unknown}"; } >>"$LOG" 2>&1
}
SITE=/tmp/site
with_wheels() {  # the wheels under .whl/ (carried: packages the device's image lacks) into $SITE, then PYTHONPATH
    if ls .whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
            .whl/*.whl >>"$LOG" 2>&1
    fi
    export PYTHONPATH=src:$SITE
}
overhead_ab() {  # overhead_ab LABEL: benchmarks/overhead.py on CUDA, ab_base/src (before) and src (after), twice each
    local round
    for round in 1 2; do
        step 50 "1 overhead before$1, round $round" env PYTHONPATH=ab_base/src:$SITE python3 benchmarks/overhead.py \
            --device cuda --calls 200 --rounds 3 --out "$OUT/overhead_before_$round.json"
        step 50 "1 overhead after, round $round" python3 benchmarks/overhead.py --device cuda --calls 200 --rounds 3 \
            --out "$OUT/overhead_after_$round.json"
    done
}
