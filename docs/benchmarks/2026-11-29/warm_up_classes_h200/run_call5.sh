#!/usr/bin/env bash
# one H200, a fresh machine: the 1.5B replay with the training warm-up of every token-count class, the gradient norm and
# a throwaway optimizer step; then the first-call probe of call 2 on 16 rows for this code (its own empty Triton cache)
set -u
o=/tmp/o5; mkdir -p $o
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
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
ls ~/.triton/cache 2>/dev/null | wc -l > $o/triton_cache_entries_before.txt
s=$(date +%s)
RLBENCH_DECODE_TRACE=$o/trace timeout 340 bash benchmarks/gpu_suites.sh $o replay-step-packed-liger-mlp14 > $o/replay15-step.log 2>&1
echo "replay rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
python3 benchmarks/ragged_decode.py $o/trace --gpu H200 --json $o/ragged_decode.json > $o/ragged_decode.log 2>&1
gzip -rf $o/trace 2>/dev/null
s=$(date +%s)
TRITON_CACHE_DIR=/tmp/tc_final timeout 120 python3 benchmarks/update_profile.py $o/final --rounds 1 --no-profile --mini-batches 1 --response-lengths $L --config $C > $o/final.log 2>&1
echo "final rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
python3 -c "
import json
r=json.load(open('$o/final/update_profile.json'))
print('set-up', r['worker'].get('rollout_warm_up_s'), r['worker'].get('training_warm_up_s'))
for k,row in r['phases'].items(): print('final', k, 'first', round(row['first_call_s'],2), 'median', round(row['median_s'],2), 'excess', round(row['first_call_s']-row['median_s'],2))
" 2>&1 | tee -a $o/summary.txt
tar czf $OUT/f.tar.gz -C $o .
grep -h "set-up\|pass  \|FAIL\|passed\|failed" $o/replay15-step.log | head -12
head -12 $o/ragged_decode.log
