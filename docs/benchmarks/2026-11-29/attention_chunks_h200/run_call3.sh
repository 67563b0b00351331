#!/usr/bin/env bash
# one H200: the attention kernel's new chunk rule (three programs an SM, rounded down): its GPU tests, the
# 1.5B replay with its decode trace, the decode step by kernel family, and the rule against the sweep again
set -u
o=/tmp/o3; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid,driver_version --format=csv > $o/gpus.csv
s=$(date +%s)
timeout 100 python3 -m pytest -q -p pytest_rlbench.plugin -p no:cacheprovider tests/test_triton_decode_attention.py \
  tests/test_fast_engine.py -k "sdpa or rope or graph_replay or on_gpu or triton_race or sampler_check" > $o/tests_gpu.log 2>&1
echo "tests rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tail -2 $o/tests_gpu.log
s=$(date +%s)
RLBENCH_DECODE_TRACE=$o/trace timeout 320 bash benchmarks/gpu_suites.sh $o replay-step-packed-liger-mlp14 > $o/replay15-step.log 2>&1
echo "replay rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
python3 benchmarks/ragged_decode.py $o/trace --gpu H200 --json $o/ragged_decode.json > $o/ragged_decode.log 2>&1
gzip -rf $o/trace 2>/dev/null
s=$(date +%s)
timeout 70 python3 benchmarks/decode_profile.py $o/profile --rows 64 16 4 --context 27648 --trace-rows 64 16 4 --attention split --fusion fused > $o/decode_profile.log 2>&1
echo "profile rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
s=$(date +%s)
timeout 60 python3 benchmarks/decode_kernels_tune.py $o/split_sweep.json --shapes --matmul-rows --split-sweep 64x4096 64x12288 64x27648 4x27648 8x27648 16x27648 24x27648 40x27648 > $o/split_sweep.log 2>&1
echo "sweep rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/f.tar.gz -C $o .
grep -h "set-up\|pass  \|FAIL\|passed\|failed" $o/replay15-step.log | head -12
head -14 $o/ragged_decode.log
grep '"step_ms"' $o/decode_profile.log
grep rule_over $o/split_sweep.log
