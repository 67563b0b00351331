#!/usr/bin/env bash
set -u
o=/tmp/oc; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid --format=csv > $o/gpus.csv
for spec in "7b_tp2 r1-distill-qwen-7b 240" "15b_tp2 r1-distill-qwen-1.5b 150"; do
  set -- $spec
  s=$(date +%s)
  timeout $3 python3 benchmarks/gpu_fidelity.py $o/$1 --preset $2 --tp 2 --engines fast --ragged 400 > $o/$1.log 2>&1
  echo "$1 rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
  tar czf $OUT/c.tar.gz -C $o .
done
s=$(date +%s)
timeout 150 python3 - > $o/hf_repeat.log 2>&1 <<'PY'
# Does transformers' generate (the hf engine) repeat its tokens at one seed on this GPU, plain, twice?
import torch
from trainer.models.presets import build_model, load_tokenizer
from trainer.rollout import make_engine
from trainer.config.schema import RolloutConfig
from trainer.rollout.requests import SamplingParams
m = build_model("r1-distill-qwen-1.5b", torch.bfloat16, "cuda", seed=0).eval()
with torch.no_grad():
    m.get_output_embeddings().weight.mul_(6.0)
tok = load_tokenizer("r1-distill-qwen-1.5b")
g = torch.Generator().manual_seed(0)
prompts = torch.randint(1, m.config.vocab_size, (16, 256), generator=g).tolist()
e = make_engine("hf", m, tok, RolloutConfig(name="hf", ignore_eos=True, n=8))
runs = [e.generate(prompts, list(range(16)), [], 8, 256, s, seed=2).response_ids.cpu()
        for s in (SamplingParams(), SamplingParams(), SamplingParams(report_entropy=True))]
for i in (1, 2):
    same = runs[0].shape == runs[i].shape and torch.equal(runs[0], runs[i])
    rows = (runs[0] != runs[i]).any(dim=1).sum().item() if runs[0].shape == runs[i].shape else -1
    first = (runs[0] != runs[i]).float().argmax(dim=1)
    print(f"call 1 vs call {i + 1}: same tokens {same}; rows differing {rows} of {runs[0].shape[0]}; "
          f"first differing step in those rows {sorted(first[(runs[0] != runs[i]).any(dim=1)].tolist())[:10]}")
PY
echo "hf_repeat rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/c.tar.gz -C $o .
grep -h -A4 "^fast" $o/*.log
cat $o/hf_repeat.log | grep -v Warn | tail -5
