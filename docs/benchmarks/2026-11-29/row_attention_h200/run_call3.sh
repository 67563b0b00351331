#!/usr/bin/env bash
# one H200: long packed rows attend alone through cuDNN at bucketed widths, plans built at set-up:
# the GPU tests of packing and the fixed chain kernel, then the 1.5B replay
set -u
o=/tmp/o3; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid,driver_version --format=csv > $o/gpus.csv
s=$(date +%s)
timeout 120 python3 -m pytest -q -p pytest_rlbench.plugin -p no:cacheprovider tests/test_packed_rows.py tests/test_training_warm_up.py \
  tests/test_split_matmul.py > $o/tests_gpu.log 2>&1
echo "tests rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tail -3 $o/tests_gpu.log
s=$(date +%s)
timeout 380 bash benchmarks/gpu_suites.sh $o replay-step-packed-liger-mlp14 > $o/replay15-step.log 2>&1
echo "replay rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/f.tar.gz -C $o .
grep -h "set-up\|pass  \|FAIL\|passed\|failed\|efficiency\|peak GPU" $o/replay15-step.log | head -14
