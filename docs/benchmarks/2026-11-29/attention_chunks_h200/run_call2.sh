#!/usr/bin/env bash
# one H200: the attention kernel at every chunk count, against its own rule, at the replay's rows and contexts
set -u
o=/tmp/o2; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid,driver_version --format=csv > $o/gpus.csv
s=$(date +%s)
timeout 500 python3 benchmarks/decode_kernels_tune.py $o/split_sweep.json --shapes --matmul-rows --split-sweep 4x4096 4x12288 4x27648 6x4096 6x12288 6x27648 8x4096 8x12288 8x27648 10x4096 10x12288 10x27648 12x4096 12x12288 12x27648 14x4096 14x12288 14x27648 16x4096 16x12288 16x27648 20x4096 20x12288 20x27648 24x4096 24x12288 24x27648 28x4096 28x12288 28x27648 32x4096 32x12288 32x27648 40x4096 40x12288 40x27648 48x4096 48x12288 48x27648 56x4096 56x12288 56x27648 62x4096 62x12288 62x27648 > $o/split_sweep.log 2>&1
echo "sweep rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/f.tar.gz -C $o .
grep rule_over $o/split_sweep.log | python3 -c "
import sys, json
for line in sys.stdin:
    d = json.loads(line); print(d['rows'], d['context'], 'rule', d['rule_splits'], round(d['rule_ms'], 3), 'best', d['best_splits'], round(d['best_ms'], 3), round(d['rule_over_best'], 3))
"
tail -3 $o/split_sweep.log
