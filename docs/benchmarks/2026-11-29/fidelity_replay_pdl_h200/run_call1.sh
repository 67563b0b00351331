#!/usr/bin/env bash
# one H200: item 5 after stop 51's decode changes (warm-up, do_not_specialize): GPU tests, the sampling check
set -u
o=/tmp/o; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid --format=csv > $o/gpus.csv
git rev-parse HEAD > $o/head.txt 2>&1
s=$(date +%s)
timeout 170 python3 -m pytest -q -p pytest_rlbench.plugin -p no:cacheprovider tests/test_triton_decode_attention.py \
  tests/test_fast_engine.py -k "sampler_check or triton_race or graph_replay or warm_up or on_gpu" > $o/tests_gpu.log 2>&1
echo "tests rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/a.tar.gz -C $o .
for spec in "15b_fast r1-distill-qwen-1.5b fast 130" "7b_fast r1-distill-qwen-7b fast 230"; do
  set -- $spec
  s=$(date +%s)
  timeout $4 python3 benchmarks/gpu_fidelity.py $o/fidelity_$1 --preset $2 --engines $3 --ragged 400 > $o/fidelity_$1.log 2>&1
  echo "$1 rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
  tar czf $OUT/a.tar.gz -C $o .
done
tail -3 $o/tests_gpu.log
grep -h -A4 "^fast" $o/*.log
