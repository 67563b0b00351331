#!/usr/bin/env bash
# one H200: the GPU tests that read the attention kernel's chunk rule (the engine's compaction test and the kernel's)
set -u
o=/tmp/o6; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid,driver_version --format=csv > $o/gpus.csv
s=$(date +%s)
timeout 140 python3 -m pytest -q -p pytest_rlbench.plugin -p no:cacheprovider tests/test_decode_compaction.py \
  tests/test_triton_decode_attention.py -k "chunks or sdpa or rope or skip" > $o/tests_gpu.log 2>&1
echo "tests rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/f.tar.gz -C $o .
tail -4 $o/tests_gpu.log
