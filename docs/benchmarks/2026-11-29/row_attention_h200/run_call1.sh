#!/usr/bin/env bash
# one H200: the GPU tests changed last session (compaction's chunk test, the MLP kernels), the packed
# attention probe (flash varlen vs cuDNN), and one packed micro-batch's training profile with its kernels
set -u
o=/tmp/o1; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid,driver_version --format=csv > $o/gpus.csv
s=$(date +%s)
timeout 150 python3 -m pytest -q -p pytest_rlbench.plugin -p no:cacheprovider tests/test_decode_compaction.py \
  tests/test_split_matmul.py tests/test_triton_decode_attention.py > $o/tests_gpu.log 2>&1
echo "tests rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tail -3 $o/tests_gpu.log
s=$(date +%s)
timeout 150 python3 benchmarks/packed_attention_probe.py $o/packed_attention.json > $o/packed_attention.log 2>&1
echo "probe rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
s=$(date +%s)
timeout 120 python3 benchmarks/longseq_profile.py $o/longseq --liger --lengths 15000,14000 27000,2500 --layouts packed left-justified \
  --checkpointing mlp/14 --trace > $o/longseq.log 2>&1
echo "longseq rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/f.tar.gz -C $o .
cut -c1-1500 $o/packed_attention.log
tail -30 $o/longseq.log | cut -c1-600
