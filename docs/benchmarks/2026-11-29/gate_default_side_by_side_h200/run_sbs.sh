#!/usr/bin/env bash
# one H200: embedded-default sessions on the GPU, each saved as a baseline, now with the short phases
# timed side by side at the end (12 passes), for the GPU gate's error rates where every phase waits on the host
set -u
o=/tmp/o; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
mkdir -p /tmp/site/pytest_rlbench-0.1.0.dist-info
printf 'Metadata-Version: 2.1\nName: pytest-rlbench\nVersion: 0.1.0\n' > /tmp/site/pytest_rlbench-0.1.0.dist-info/METADATA
printf '[pytest11]\nrlbench = pytest_rlbench.plugin\n' > /tmp/site/pytest_rlbench-0.1.0.dist-info/entry_points.txt
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid,driver_version --format=csv > $o/gpus.csv
nproc >> $o/gpus.csv
# (PASSES: an experiment only, the GPU passes are now the code's own)
grep -n "^SIDE_BY_SIDE_PASSES" pytest_rlbench/verdict/retiming.py >> $o/runs.txt
s=$(date +%s)
RL_GATE_PLAN="${PLAN:-same same update_actor:0.25 same same}" timeout ${LIMIT:-540} bash benchmarks/gpu_suites.sh $o gate-default > $o/suites.log 2>&1
echo "gate-default rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/f.tar.gz -C $o .
grep -v "^$" $o/suites.log | tail -20
