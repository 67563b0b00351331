#!/usr/bin/env bash
# stop 50, call 4 (nvidia-h200-x4): the 1.5B replay on 4 GPUs with trainer.balance_batch (on by default)
set -u
o=/tmp/od; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid --format=csv > $o/gpus.csv
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used,power.draw --format=csv -l 2 > $o/smi.csv 2>&1 &
smi=$!
s=$(date +%s)
RL_GPUS=4 timeout 390 bash benchmarks/gpu_suites.sh $o replay-step-packed-liger-mlp14 > $o/replay-step-packed-liger-mlp14.log 2>&1
echo "replay-step-packed-liger-mlp14 rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
kill $smi
gzip -f $o/smi.csv; [ -f $o/replay-step-packed-liger-mlp14.json ] && gzip -f $o/replay-step-packed-liger-mlp14.json; true
tar czf $OUT/d.tar.gz -C $o .
tail -40 $o/replay-step-packed-liger-mlp14.log
