#!/usr/bin/env bash
# one H200: padded attention's per-shape cost under each SDPA backend; the training phases' first call and a later one
# with cuDNN's attention on (torch's default here) and off, after the new training warm-up, 16 rows of the 1.5B replay
set -u
o=/tmp/o4; mkdir -p $o
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
for m in r1-distill-qwen-1.5b r1-distill-qwen-7b; do
  s=$(date +%s)
  timeout 100 python3 benchmarks/first_call_probe.py $o/probe_$m.json --model $m --shapes 6 --padded cudnn flash efficient > $o/probe_$m.log 2>&1
  echo "probe $m rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
done
grep '"backend"' $o/probe_r1-distill-qwen-1.5b.log | head -20
for v in cudnn_on cudnn_off; do
  flag=True; [ $v = cudnn_off ] && flag=False
  s=$(date +%s)
  TRITON_CACHE_DIR=/tmp/tc_$v timeout 150 python3 -c "
import sys, runpy, torch
torch.backends.cuda.enable_cudnn_sdp($flag)
sys.argv = ['update_profile.py'] + sys.argv[1:]
runpy.run_path('benchmarks/update_profile.py', run_name='__main__')
" $o/$v --rounds 1 --no-profile --mini-batches 1 --response-lengths $L --config $C > $o/$v.log 2>&1
  echo "$v rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
  python3 -c "
import json
r=json.load(open('$o/$v/update_profile.json'))
for k,row in r['phases'].items(): print('$v', k, 'first', round(row['first_call_s'],2), 'median', round(row['median_s'],2), 'excess', round(row['first_call_s']-row['median_s'],2))
" 2>&1 | tee -a $o/summary.txt
done
tar czf $OUT/f.tar.gz -C $o .
