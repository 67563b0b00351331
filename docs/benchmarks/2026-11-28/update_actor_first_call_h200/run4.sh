#!/usr/bin/env bash
# stop 49, call 4 (one H200): the first call on a new shape against the second, packed attention and liger.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
R=$OUT/r; mkdir -p $R
(cd benchmarks && timeout 200 python3 first_call_probe.py $R/first_call_probe.json --shapes 5) > $R/first_call_probe.log 2>&1
echo "probe rc $?" >> $R/rc.txt
python3 -c "import torch; print(torch.__version__, torch.backends.cudnn.version())" >> $R/rc.txt
