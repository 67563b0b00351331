#!/usr/bin/env bash
# one H200: item 5 after the attention kernel's new chunk rule: the sampling check (1.5B and 7B, fast engine)
# and the fidelity panel
set -u
o=/tmp/o4; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid,driver_version --format=csv > $o/gpus.csv
for spec in "15b_fast r1-distill-qwen-1.5b fast 130" "7b_fast r1-distill-qwen-7b fast 200"; do
  set -- $spec
  s=$(date +%s)
  timeout $4 python3 benchmarks/gpu_fidelity.py $o/fidelity_$1 --preset $2 --engines $3 --ragged 400 > $o/fidelity_$1.log 2>&1
  echo "$1 rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
done
tar czf $OUT/f.tar.gz -C $o .
s=$(date +%s)
timeout 240 bash benchmarks/gpu_suites.sh $o panel16x8 > $o/panel16x8.log 2>&1
echo "panel rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/f.tar.gz -C $o .
grep -h -A4 "^fast" $o/fidelity_*.log
tail -22 $o/panel16x8.log
