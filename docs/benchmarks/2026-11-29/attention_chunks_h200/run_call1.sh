#!/usr/bin/env bash
# one H200: the fused decode MLP kernels' GPU tests, then their timings against the engine's four kernels
set -u
o=/tmp/o1; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid,driver_version --format=csv > $o/gpus.csv
s=$(date +%s)
timeout 150 python3 -m pytest -q -p pytest_rlbench.plugin -p no:cacheprovider tests/test_decode_mlp.py > $o/tests_gpu.log 2>&1
echo "tests rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tail -5 $o/tests_gpu.log
for m in r1-distill-qwen-1.5b; do
  s=$(date +%s)
  timeout 200 python3 benchmarks/decode_mlp_probe.py $o/mlp_$m.json --model $m --rows 4 16 64 \
     --variants engine gate_up_silu+cublas gate_up_silu+down_tiles atomic > $o/mlp_$m.log 2>&1
  echo "probe $m rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
  s=$(date +%s)
  timeout 90 python3 benchmarks/decode_mlp_probe.py $o/mlp_barrier_$m.json --model $m --rows 4 16 64 \
     --variants engine barrier > $o/mlp_barrier_$m.log 2>&1
  echo "barrier $m rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
  grep "^rows" $o/mlp_$m.log $o/mlp_barrier_$m.log
done
tar czf $OUT/f.tar.gz -C $o .
