#!/bin/bash
# one H200: the attention kernel's integers unspecialised: the member step's pace, the warm-up and two calls, GPU tests
# call 4 (the attention kernel with attn_len, tiles_per_split and shared_slots unspecialised) ran the last
# pytest line with tests/test_fast_engine.py added and a 150 s limit; call 5 (tiles_per_split and splits only) as below
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,memory.total --format=csv > $R/gpu.csv
cd benchmarks
timeout 100 python3 decode_profile.py $R/member --model r1-distill-qwen-7b --tp 2 --rows 64 16 4 \
  --context 2048 27648 --trace-rows --attention split --fusion fused > $R/member.log 2>&1; echo "profile rc $?" >> $R/member.log
timeout 330 python3 gen_call_probe.py $R/gen7b_member_warm --calls 2 --warm-up > $R/gen7b_member_warm.log 2>&1; echo "probe rc $?" >> $R/gen7b_member_warm.log
cd ..
timeout 100 python3 -m pytest -q -p no:cacheprovider -p pytest_rlbench.plugin tests/test_triton_decode_attention.py > $R/gpu_tests.log 2>&1; echo "tests rc $?" >> $R/gpu_tests.log
cd $OUT && tar czf r.tgz r && rm -rf r
