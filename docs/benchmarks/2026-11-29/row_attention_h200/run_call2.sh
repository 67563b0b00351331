#!/usr/bin/env bash
# one H200: the packed attention probe, each backend in its own process; cudnn_rows at three buckets
set -u
o=/tmp/o2; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid,driver_version --format=csv > $o/gpus.csv
s=$(date +%s)
timeout 240 python3 benchmarks/packed_attention_probe.py $o/packed_attention.json > $o/packed_attention.log 2>&1
echo "probe rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
for b in 128 1024; do
s=$(date +%s)
timeout 60 python3 benchmarks/packed_attention_probe.py $o/packed_attention_rows$b.json --backends cudnn_rows --bucket $b > $o/packed_attention_rows$b.log 2>&1
echo "rows $b rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
done
tar czf $OUT/f.tar.gz -C $o .
grep -h "accuracy\|new_shapes\|error" $o/packed_attention*.log | cut -c1-700
