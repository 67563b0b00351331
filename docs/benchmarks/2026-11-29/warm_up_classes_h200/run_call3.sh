#!/usr/bin/env bash
# one H200: the first calls of old_log_prob and update_actor after the new training warm-up, profiled (torch's profiler),
# on the 1.5B replay's first mini-batch (16 rows), an empty Triton cache
set -u
o=/tmp/o3; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid,driver_version --format=csv > $o/gpus.csv
L="11406 13691 9965 12153 25510 17141 9283 12895 17906 27648 27267 12140 6909 22371 12691 8103 "
C="actor_rollout_ref.model.path=r1-distill-qwen-1.5b data.max_prompt_length=148 data.max_response_length=27648
 actor_rollout_ref.rollout.n=16 data.train_batch_size=1 actor_rollout_ref.actor.ppo_mini_batch_size=1
 actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30000
 actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=30000
 actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=30000
 actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.model.enable_gradient_checkpointing=True
 actor_rollout_ref.model.gradient_checkpointing_policy=mlp actor_rollout_ref.model.gradient_checkpointing_layers=14
 actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.rollout.free_cache_engine=True"
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TRITON_CACHE_DIR=/tmp/tc_new
s=$(date +%s)
timeout 200 python3 benchmarks/update_profile.py $o/new --rounds 1 --no-profile --profile-first --mini-batches 1 --response-lengths $L --config $C > $o/new.log 2>&1
echo "new rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
tar czf $OUT/f.tar.gz -C $o .
python3 - <<'PY'
import json
r=json.load(open('/tmp/o3/new/update_profile.json'))
for p,row in r['phases'].items():
    print(p, 'first', round(row['first_call_s'],2), 'median', round(row['median_s'],2))
    t=row.get('trace_first_call')
    if t: print(json.dumps(t)[:2500])
PY
