#!/usr/bin/env bash
# one H200: the attention kernel's tiles and the merge's block at the replay's shapes; the layer matmuls at 4-64 rows
set -u
o=/tmp/o1; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid,driver_version --format=csv > $o/gpus.csv
s=$(date +%s)
timeout 330 python3 benchmarks/decode_kernels_tune.py $o/tiles.json --shapes 64x4096 64x12288 64x20480 32x12288 32x20480 16x16384 16x27648 8x27648 4x27648 --attention-splits rule --merge-blocks 16 32 64 128 --matmul-rows > $o/tiles.log 2>&1
echo "tiles rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
s=$(date +%s)
timeout 150 python3 benchmarks/decode_kernels_tune.py $o/matmul.json --shapes --matmul-rows 4 16 64 --split-matmul-rows 4 16 > $o/matmul.log 2>&1
echo "matmul rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/f.tar.gz -C $o .
python3 - <<'PY'
import json
r = json.load(open("/tmp/o1/tiles.json"))
best = {}
for e in r["attention"]:
    if "ms" not in e: continue
    key = (e["rows"], e["context"])
    best.setdefault(key, []).append((e["ms"], e["block_n"], e["num_warps"], e["num_stages"]))
for key, v in best.items():
    v.sort(); eng = [x for x in v if x[1:] == (32, 4, 3)]
    print(key, "rule splits", [e["rule_splits"] for e in r["attention"] if (e.get("rows"), e.get("context")) == key][0], "engine", eng, "best3", v[:3])
for e in r["merge"]:
    print("merge", e["rows"], e["context"], e["merge_block"], round(e["ms"], 4), e["max_abs_diff"])
PY
grep -h best_split /tmp/o1/matmul.log | cut -c1-300
grep -h '"kernel": "cublas"' /tmp/o1/matmul.log
