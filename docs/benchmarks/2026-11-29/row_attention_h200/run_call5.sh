#!/usr/bin/env bash
# one H200: where update_actor's time goes on the 1.5B replay's first mini-batch (16 rows) after the lone-row
# attention change: timed rounds, then one call under torch's profiler (kernel families, host gaps); then the
# same with the MLP checkpointed on 8 layers instead of 14 (time and peak memory)
set -u
o=/tmp/o5; mkdir -p $o
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid,driver_version --format=csv > $o/gpus.csv
L="11406 13691 9965 12153 25510 17141 9283 12895 17906 27648 27267 12140 6909 22371 12691 8103 "
C="actor_rollout_ref.model.path=r1-distill-qwen-1.5b data.max_prompt_length=148 data.max_response_length=27648
 actor_rollout_ref.rollout.n=16 data.train_batch_size=1 actor_rollout_ref.actor.ppo_mini_batch_size=1
 actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30000
 actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=30000
 actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=30000
 actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.model.enable_gradient_checkpointing=True
 actor_rollout_ref.model.gradient_checkpointing_policy=mlp
 actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.rollout.free_cache_engine=True"
for n in 14 8; do
s=$(date +%s)
timeout 200 python3 benchmarks/update_profile.py $o/mlp$n --rounds 2 --phases old_log_prob update_actor --mini-batches 1 \
  --response-lengths $L --config $C actor_rollout_ref.model.gradient_checkpointing_layers=$n $( [ $n = 8 ] && echo --no-profile ) > $o/mlp$n.log 2>&1
echo "mlp$n rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
done
tar czf $OUT/f.tar.gz -C $o .
tail -5 $o/mlp14.log | cut -c1-1500
tail -3 $o/mlp8.log | cut -c1-800
