#!/usr/bin/env bash
# one H200, a fresh machine (cold Triton cache): the 1.5B replay with the amended training warm-up (debcfca/eaf0b4f),
# then the 1.5B decode step by kernel family at the replay's shapes
set -u
o=/tmp/o1; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid,driver_version --format=csv > $o/gpus.csv
ls ~/.triton/cache 2>/dev/null | wc -l > $o/triton_cache_entries_before.txt
git rev-parse HEAD > $o/head.txt 2>&1
s=$(date +%s)
RLBENCH_DECODE_TRACE=$o/trace timeout 340 bash benchmarks/gpu_suites.sh $o replay-step-packed-liger-mlp14 > $o/replay15-step.log 2>&1
echo "replay rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
python3 benchmarks/ragged_decode.py $o/trace --gpu H200 --json $o/ragged_decode.json > $o/ragged_decode.log 2>&1 || python3 benchmarks/ragged_decode.py $o/trace --gpu H200 > $o/ragged_decode.log 2>&1
gzip -rf $o/trace 2>/dev/null
s=$(date +%s)
timeout 200 python3 benchmarks/decode_profile.py $o/profile --rows 64 16 4 --context 27648 --trace-rows 64 16 4 --attention split --fusion fused > $o/decode_profile.log 2>&1
echo "profile rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/f.tar.gz -C $o .
grep -h "set-up\|pass  \|FAIL\|passed\|failed" $o/replay15-step.log | head -12
tail -30 $o/decode_profile.log
