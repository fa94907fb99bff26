#!/bin/bash
# before (HEAD, /tmp/qbase) and after (working tree), alternating; bytecode written (Python's default)
unset PYTHONDONTWRITEBYTECODE
source /work/main/.venv/bin/activate
for dir in /tmp/qbase /work/main; do (cd $dir && PYTHONPATH=$dir/src python -m pytest -m "not slow" -q -p no:cacheprovider --collect-only >/dev/null 2>&1); done
for i in 1 2; do for dir in /tmp/qbase /work/main; do
  cd $dir; s=$(date +%s.%N); PYTHONPATH=$dir/src timeout 900 python -m pytest -m "not slow" -n 2 -q -p no:cacheprovider > /tmp/quick_ab_$(basename $dir)_$i.txt 2>&1; e=$(date +%s.%N)
  echo "$(basename $dir) run $i: $(echo "$e - $s" | bc) s wall; $(tail -1 /tmp/quick_ab_$(basename $dir)_$i.txt)"
done; done
