#!/usr/bin/env bash
# one H200: at the 7B's heads (28 query, 4 K/V, 128 wide): the probe's flash kernel against one row at a time
# (bucket 512), and build_row_plans' set-up seconds and peak memory for the 7B's widths up to 28,672 tokens
set -u
o=/tmp/o6; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid,driver_version --format=csv > $o/gpus.csv
s=$(date +%s)
timeout 100 python3 benchmarks/packed_attention_probe.py $o/packed_attention_7b.json --heads 28 4 128 --backends flash_varlen cudnn_rows --bucket 512 --new-shapes 0 > $o/packed_attention_7b.log 2>&1
echo "probe rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
s=$(date +%s)
timeout 120 python3 -c "
import time, torch
from trainer.models.presets import PRESETS
from transformers import Qwen2Config
from trainer.models.packed_attention import build_row_plans
for name in ('r1-distill-qwen-7b', 'r1-distill-qwen-1.5b'):
    cfg = Qwen2Config(**PRESETS[name])
    torch.cuda.reset_peak_memory_stats(); torch.cuda.synchronize(); t = time.perf_counter()
    n = build_row_plans(cfg, torch.device('cuda'), torch.bfloat16, 1024 + 27648)
    torch.cuda.synchronize(); first = time.perf_counter() - t
    t = time.perf_counter(); build_row_plans(cfg, torch.device('cuda'), torch.bfloat16, 1024 + 27648); torch.cuda.synchronize()
    print(name, 'widths', n, 'first %.2f s' % first, 'again %.2f s' % (time.perf_counter() - t), 'peak %.2f GiB' % (torch.cuda.max_memory_allocated() / 2**30), flush=True)
" > $o/row_plans.log 2>&1
echo "plans rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/f.tar.gz -C $o .
cat $o/row_plans.log
grep -o '"backend": "[a-z_]*", "lengths": \[[0-9, ]*\].\{0,200\}' $o/packed_attention_7b.log | cut -c1-260
