#!/usr/bin/env bash
# one H200: where one row at a time (cuDNN, bucket 512) starts to beat the flash kernel: micro-batches of
# equal rows of 2,100 to 10,000 tokens, at the 1.5B's heads and the 7B's
set -u
o=/tmp/o7; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid,driver_version --format=csv > $o/gpus.csv
rep() { local n=$1 s=$2; local out=$s; for ((i=1;i<n;i++)); do out="$out,$s"; done; echo $out; }
S="$(rep 13 2100) $(rep 9 3000) $(rep 7 4000) $(rep 6 5000) $(rep 5 6000) $(rep 4 7000) $(rep 3 10000)"
for h in "12 2 128" "28 4 128"; do
  tag=$(echo $h | tr ' ' '_')
  s=$(date +%s)
  timeout 110 python3 benchmarks/packed_attention_probe.py $o/crossover_$tag.json --heads $h --backends flash_varlen cudnn_rows --bucket 512 --new-shapes 0 --shapes $S > $o/crossover_$tag.log 2>&1
  echo "$tag rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
done
tar czf $OUT/f.tar.gz -C $o .
