#!/bin/bash
# one H200: the 7B's decode-group member step (tp 2 shapes, no sums) by rows and context, its kernels in order
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,memory.total --format=csv > $R/gpu.csv
git rev-parse HEAD > $R/head.txt 2>&1
cd benchmarks
timeout 330 python3 decode_profile.py $R/member --model r1-distill-qwen-7b --tp 2 --rows 64 32 16 8 4 \
  --context 2048 8192 16384 27648 --trace-rows 64 16 4 --replayed-traces --attention split --fusion fused \
  > $R/member.log 2>&1; echo "profile rc $?" >> $R/member.log
timeout 200 python3 decode_kernels_tune.py $R/tune_tp2.json --model r1-distill-qwen-7b --tp 2 \
  --shapes 4x27648 16x16384 --matmul-rows 64 16 4 > $R/tune.log 2>&1; echo "tune rc $?" >> $R/tune.log
cd $OUT && tar czf r.tgz r && rm -rf r
