#!/usr/bin/env bash
# one H200: the packing tests after the lone-row threshold moved to 6,144 tokens (the GPU test at 6,200 and 6,700)
set -u
o=/tmp/o9; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid,driver_version --format=csv > $o/gpus.csv
s=$(date +%s)
timeout 120 python3 -m pytest -q -p pytest_rlbench.plugin -p no:cacheprovider tests/test_packed_rows.py tests/test_training_warm_up.py > $o/tests_gpu.log 2>&1
echo "tests rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/f.tar.gz -C $o .
tail -3 $o/tests_gpu.log
