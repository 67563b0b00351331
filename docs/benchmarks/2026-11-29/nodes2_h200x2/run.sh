#!/bin/bash
# .whl/run.sh LIMIT_S 'COMMANDS': install the carried wheels, register the plugin, run COMMANDS (with
# R=/tmp/res for results) under a time limit, then pack $R into $OUT/res.tgz (one file back).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
d=/tmp/site/pytest_rlbench-0.1.0.dist-info; mkdir -p $d
printf 'Metadata-Version: 2.1\nName: pytest-rlbench\nVersion: 0.1.0\n' > $d/METADATA
printf '[pytest11]\nrlbench = pytest_rlbench.plugin\n' > $d/entry_points.txt
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 R=/tmp/res
mkdir -p $R
(nvidia-smi -L; nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv; nvidia-smi topo -m; lscpu | head -20; git log --oneline -1) > $R/machine.txt 2>&1
timeout -k 5 "$1" bash -c "$2" 2>&1 | tee $R/console.log
echo "rc=${PIPESTATUS[0]}"
tar czf $OUT/res.tgz -C $R .
