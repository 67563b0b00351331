#!/usr/bin/env bash
set -u
o=/tmp/oe; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid --format=csv > $o/gpus.csv
nvidia-smi topo -m > $o/topo.txt 2>&1
python3 -c "import torch; print(torch.__version__); print(torch.ops.symm_mem.one_shot_all_reduce_copy.default._schema)" > $o/schema.txt 2>&1
s=$(date +%s)
timeout 330 python3 benchmarks/tp_decode_probe.py $o --rows 32 8 2 --context 2048 27648 --prompts 4 --n 8 --max-new 1024 --modes tp2 tp2-one_shot > $o/probe.log 2>&1
echo "probe rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
[ -f $o/tp_decode_probe.json ] && gzip -f $o/tp_decode_probe.json
tar czf $OUT/e.tar.gz -C $o .
cat $o/schema.txt
grep -v Warning $o/probe.log | tail -40
