#!/bin/bash
# one H200: the engine's warm-up, then group 1's 64 rows of the 7B replay (a decode-group member's shapes), twice
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,memory.total --format=csv > $R/gpu.csv
cd benchmarks
timeout 560 python3 gen_call_probe.py $R/gen7b_member_warm --calls 2 --warm-up > $R/gen7b_member_warm.log 2>&1; echo "probe rc $?" >> $R/gen7b_member_warm.log
cd $OUT && tar czf r.tgz r && rm -rf r
