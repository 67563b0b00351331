#!/usr/bin/env bash
# one H200: the embedded default on the GPU, saved (its host-bound phases now re-timed and side by side,
# for the record), then gated on it (side by side again, beside the baseline's)
set -u
o=/tmp/o5; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
mkdir -p /tmp/site/pytest_rlbench-0.1.0.dist-info
printf 'Metadata-Version: 2.1\nName: pytest-rlbench\nVersion: 0.1.0\n' > /tmp/site/pytest_rlbench-0.1.0.dist-info/METADATA
printf '[pytest11]\nrlbench = pytest_rlbench.plugin\n' > /tmp/site/pytest_rlbench-0.1.0.dist-info/entry_points.txt
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid,driver_version --format=csv > $o/gpus.csv
s=$(date +%s)
timeout 110 python3 -m pytest -q -p no:cacheprovider suites/ --gpu --rl-save-baseline $o/a.baseline.json --rl-report $o/a.json > $o/a.log 2>&1
echo "save rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
s=$(date +%s)
timeout 110 python3 -m pytest -q -p no:cacheprovider suites/ --gpu --rl-baseline $o/a.baseline.json --rl-report $o/b.json > $o/b.log 2>&1
echo "gate rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/f.tar.gz -C $o .
tail -3 $o/a.log; grep -A22 "=== rlbench ===" $o/b.log | head -26
