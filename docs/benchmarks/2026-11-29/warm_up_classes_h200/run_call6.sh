#!/usr/bin/env bash
# one H200, a fresh machine: the 1.5B replay again (the same code as call 5), for the spread between machines
set -u
o=/tmp/o6; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid,driver_version --format=csv > $o/gpus.csv
ls ~/.triton/cache 2>/dev/null | wc -l > $o/triton_cache_entries_before.txt
s=$(date +%s)
timeout 330 bash benchmarks/gpu_suites.sh $o replay-step-packed-liger-mlp14 > $o/replay15-step.log 2>&1
echo "replay rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/f.tar.gz -C $o .
grep -h "set-up\|pass  \|FAIL\|passed\|failed" $o/replay15-step.log | head -12
