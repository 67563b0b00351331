#!/usr/bin/env bash
# one H200: the chain again with PDL's trigger early, late and at exit (1.5B), and the 7B tp2 member
set -u
o=/tmp/o4; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid --format=csv > $o/gpus.csv
s=$(date +%s)
timeout 200 python3 benchmarks/pdl_matmul_chain.py $o/chain_15b.json --rows 4 16 64 > $o/chain_15b.log 2>&1
echo "15b rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/d.tar.gz -C $o .
s=$(date +%s)
timeout 120 python3 benchmarks/pdl_matmul_chain.py $o/chain_7b_tp2.json --model r1-distill-qwen-7b --tp 2 --rows 4 64 > $o/chain_7b_tp2.log 2>&1
echo "7b rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/d.tar.gz -C $o .
grep -h "rows, " $o/*.log
