#!/usr/bin/env bash
# one H200: sessions of the embedded default on the GPU (tiny model), each saved as a baseline (counts,
# side by side), for the GPU gate's error rates where every phase waits on the host
set -u
o=/tmp/o4; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
mkdir -p /tmp/site/pytest_rlbench-0.1.0.dist-info
printf 'Metadata-Version: 2.1\nName: pytest-rlbench\nVersion: 0.1.0\n' > /tmp/site/pytest_rlbench-0.1.0.dist-info/METADATA
printf '[pytest11]\nrlbench = pytest_rlbench.plugin\n' > /tmp/site/pytest_rlbench-0.1.0.dist-info/entry_points.txt
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid,driver_version --format=csv > $o/gpus.csv
s=$(date +%s)
RL_GATE_PLAN="${PLAN:-same same update_actor:0.5 same same}" timeout 500 bash benchmarks/gpu_suites.sh $o gate-default > $o/suites.log 2>&1
echo "gate-default rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/f.tar.gz -C $o .
cat $o/suites.log | grep -v "^$" | tail -20
