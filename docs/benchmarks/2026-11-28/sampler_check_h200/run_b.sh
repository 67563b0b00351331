#!/usr/bin/env bash
set -u
o=/tmp/ob; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid --format=csv > $o/gpus.csv
s=$(date +%s)
timeout 280 python3 benchmarks/gpu_fidelity.py $o/7b_hf --preset r1-distill-qwen-7b --engines hf --ragged 400 > $o/7b_hf.log 2>&1
echo "7b_hf rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/b.tar.gz -C $o .
s=$(date +%s)
timeout 280 bash benchmarks/gpu_suites.sh $o panel16x8 > $o/panel16x8.log 2>&1
echo "panel rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/b.tar.gz -C $o .
grep -h -A4 "^hf" $o/7b_hf.log
tail -30 $o/panel16x8.log
