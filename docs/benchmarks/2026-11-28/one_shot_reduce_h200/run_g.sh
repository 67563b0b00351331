#!/usr/bin/env bash
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
timeout 150 python3 -m pytest -q -p pytest_rlbench.plugin -p no:cacheprovider tests/test_tensor_parallel_decode.py -k "one_shot or reduce_setting" > $OUT/one_shot_test_x2.log 2>&1
echo "rc $?" >> $OUT/one_shot_test_x2.log
tail -30 $OUT/one_shot_test_x2.log
