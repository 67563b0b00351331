#!/usr/bin/env bash
# one H200, after this session's fixes: the GPU tests with the plugin registered as pip registers it, and
# the embedded default on the GPU saved as a baseline, then gated on it (counted work on both sides)
set -u
o=/tmp/o3; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
# the plugin's entry point, as `pip install -e .` writes it (pytester's inner sessions load it from there)
mkdir -p /tmp/site/pytest_rlbench-0.1.0.dist-info
printf 'Metadata-Version: 2.1\nName: pytest-rlbench\nVersion: 0.1.0\n' > /tmp/site/pytest_rlbench-0.1.0.dist-info/METADATA
printf '[pytest11]\nrlbench = pytest_rlbench.plugin\n' > /tmp/site/pytest_rlbench-0.1.0.dist-info/entry_points.txt
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid,driver_version --format=csv > $o/gpus.csv
s=$(date +%s)
timeout 240 python3 -m pytest -q -p no:cacheprovider -n 4 --dist loadfile \
  tests/test_batch_to_device.py tests/test_counted_work.py tests/test_decode_compaction.py tests/test_fast_engine.py \
  tests/test_head_logprobs.py tests/test_liger.py tests/test_memory_peaks.py tests/test_optimizer_offload.py \
  tests/test_packed_rows.py tests/test_plugin_fixtures.py tests/test_rollout_target_lengths.py tests/test_split_matmul.py \
  tests/test_triton_decode_attention.py tests/test_triton_decode_fused.py tests/test_training_warm_up.py \
  tests/test_ragged_decode.py tests/test_setup_figures.py tests/test_summary_answer.py tests/test_metrics.py > $o/tests_gpu.log 2>&1
echo "tests rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
s=$(date +%s)
timeout 130 python3 -m pytest -p no:cacheprovider suites/ --gpu --rl-save-baseline $o/b.json --rl-report $o/saved.json > $o/saved.log 2>&1
echo "save rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
s=$(date +%s)
timeout 150 python3 -m pytest -p no:cacheprovider suites/ --gpu --rl-baseline $o/b.json --rl-report $o/gated.json > $o/gated.log 2>&1
echo "gate rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/f.tar.gz -C $o .
tail -4 $o/tests_gpu.log
grep -A12 "=== rlbench ===" $o/saved.log | head -14
grep -A40 "=== rlbench ===" $o/gated.log | head -45
