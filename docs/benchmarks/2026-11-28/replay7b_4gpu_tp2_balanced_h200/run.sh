#!/usr/bin/env bash
# stop 50, call 3 (nvidia-h200-x4): the 7B replay with trainer.balance_batch (on by default) and the reservation
set -u
o=/tmp/od; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid --format=csv > $o/gpus.csv
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used,power.draw --format=csv -l 2 > $o/smi.csv 2>&1 &
smi=$!
s=$(date +%s)
RL_GPUS=4 timeout 560 bash benchmarks/gpu_suites.sh $o replay7b-step-tp2 > $o/replay7b-step-tp2.log 2>&1
echo "replay7b-step-tp2 rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
kill $smi
gzip -f $o/smi.csv; [ -f $o/replay7b-step-tp2.json ] && gzip -f $o/replay7b-step-tp2.json; true
tar czf $OUT/d.tar.gz -C $o .
tail -40 $o/replay7b-step-tp2.log
