#!/usr/bin/env bash
# one H200 (another machine): the probe's lone rows at the trainer's bucket (512) beside the flash kernel,
# then the 1.5B replay again
set -u
o=/tmp/o4; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid,driver_version --format=csv > $o/gpus.csv
s=$(date +%s)
timeout 100 python3 benchmarks/packed_attention_probe.py $o/packed_attention_rows512.json --backends flash_varlen cudnn_rows --bucket 512 > $o/packed_attention_rows512.log 2>&1
echo "probe rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
s=$(date +%s)
timeout 380 bash benchmarks/gpu_suites.sh $o replay-step-packed-liger-mlp14 > $o/replay15-step.log 2>&1
echo "replay rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/f.tar.gz -C $o .
grep -h "set-up\|pass  \|FAIL\|passed\|failed\|efficiency" $o/replay15-step.log | head -10
grep -h "new_shapes" $o/packed_attention_rows512.log
