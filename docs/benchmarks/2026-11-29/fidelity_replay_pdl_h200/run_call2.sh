#!/usr/bin/env bash
# one H200: the 1.5B replay with the rollout warm-up at set-up (item 2), then the fidelity panel (item 5)
set -u
o=/tmp/o2; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid --format=csv > $o/gpus.csv
git rev-parse HEAD > $o/head.txt 2>&1
s=$(date +%s)
RLBENCH_DECODE_TRACE=$o/trace timeout 330 bash benchmarks/gpu_suites.sh $o replay-step-packed-liger-mlp14 > $o/replay15-step.log 2>&1
echo "replay rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
gzip -rf $o/trace 2>/dev/null
tar czf $OUT/b.tar.gz -C $o .
s=$(date +%s)
timeout 250 bash benchmarks/gpu_suites.sh $o panel16x8 > $o/panel16x8.log 2>&1
echo "panel rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/b.tar.gz -C $o .
grep -h "set-up\|^  gen\|^  step\|passed\|failed\|pass  \|FAIL" $o/replay15-step.log | head -30
tail -25 $o/panel16x8.log
