#!/usr/bin/env bash
# one H200: the fidelity panel after the attention kernel's new chunk rule (call 4's ran out of time)
set -u
o=/tmp/o5; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid,driver_version --format=csv > $o/gpus.csv
s=$(date +%s)
timeout 470 bash benchmarks/gpu_suites.sh $o panel16x8 > $o/panel16x8.log 2>&1
echo "panel rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/f.tar.gz -C $o .
tail -22 $o/panel16x8.log
