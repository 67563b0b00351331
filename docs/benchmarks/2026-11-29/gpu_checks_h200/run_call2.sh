#!/usr/bin/env bash
# one H200: the default suite with --gpu (a newcomer's first GPU run) and the GPU tests, at HEAD
set -u
o=/tmp/o2; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid,driver_version --format=csv > $o/gpus.csv
git log --oneline -1 > $o/head.txt 2>&1
s=$(date +%s)
timeout 200 python3 -m pytest -p pytest_rlbench.plugin -p no:cacheprovider suites/ --gpu --rl-report $o/suites_gpu.json > $o/suites_gpu.log 2>&1
echo "suites --gpu rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
s=$(date +%s)
timeout 300 python3 -m pytest -q -p pytest_rlbench.plugin -p no:cacheprovider -n 4 --dist loadfile \
  tests/test_batch_to_device.py tests/test_counted_work.py tests/test_decode_compaction.py tests/test_fast_engine.py \
  tests/test_head_logprobs.py tests/test_liger.py tests/test_memory_peaks.py tests/test_optimizer_offload.py \
  tests/test_packed_rows.py tests/test_plugin_fixtures.py tests/test_rollout_target_lengths.py tests/test_split_matmul.py \
  tests/test_triton_decode_attention.py tests/test_triton_decode_fused.py tests/test_training_warm_up.py \
  tests/test_ragged_decode.py > $o/tests_gpu.log 2>&1
echo "tests rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/f.tar.gz -C $o .
tail -60 $o/suites_gpu.log
tail -15 $o/tests_gpu.log
