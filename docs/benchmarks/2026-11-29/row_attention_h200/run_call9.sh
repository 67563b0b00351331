#!/usr/bin/env bash
# one H200: after the review's mends: the packing tests, the probe once (its refactor), the 1.5B sampling check
set -u
o=/tmp/o10; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid,driver_version --format=csv > $o/gpus.csv
s=$(date +%s)
timeout 60 python3 -m pytest -q -p pytest_rlbench.plugin -p no:cacheprovider tests/test_packed_rows.py > $o/tests_gpu.log 2>&1
echo "tests rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
s=$(date +%s)
timeout 40 python3 benchmarks/packed_attention_probe.py $o/probe.json --backends cudnn_rows --bucket 512 --shapes 15000,14000 --new-shapes 0 > $o/probe.log 2>&1
echo "probe rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
s=$(date +%s)
timeout 80 python3 benchmarks/gpu_fidelity.py $o/fidelity_15b_fast --preset r1-distill-qwen-1.5b --engines fast --ragged 400 > $o/fidelity_15b_fast.log 2>&1
echo "15b_fast rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/f.tar.gz -C $o .
tail -1 $o/tests_gpu.log; grep -o '"forward_tflops": [0-9.]*' $o/probe.log; grep -h -A4 "^fast" $o/fidelity_15b_fast.log
