L="11406 13691 9965 12153 25510 17141 9283 12895 17906 27648 27267 12140 6909 22371 12691 8103"
C="actor_rollout_ref.model.path=r1-distill-qwen-1.5b data.max_prompt_length=148 data.max_response_length=27648 actor_rollout_ref.rollout.n=16 data.train_batch_size=1 actor_rollout_ref.actor.ppo_mini_batch_size=1 actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30000 actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=30000 actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=30000 actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.model.enable_gradient_checkpointing=True actor_rollout_ref.model.gradient_checkpointing_policy=mlp actor_rollout_ref.model.gradient_checkpointing_layers=14 actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.rollout.free_cache_engine=True"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid --format=csv > $R/gpus.csv
for w in 1 4; do  # (this call ran without OMP_NUM_THREADS: each --world 4 worker had 64 threads)
  s=$(date +%s)
  timeout 200 python3 benchmarks/update_profile.py $R/w$w --world $w --rounds 2 --phases old_log_prob update_actor --mini-batches 1 --response-lengths $L --config $C > $R/w$w.log 2>&1
  echo "world $w rc $? $(( $(date +%s) - s )) s" | tee -a $R/runs.txt
  tail -5 $R/w$w.log
done
# each GPU alone on the same rows: the chips' own spread under the power cap
for g in 1 2 3; do
  s=$(date +%s)
  CUDA_VISIBLE_DEVICES=$g timeout 120 python3 benchmarks/update_profile.py $R/g$g --no-profile --rounds 2 --phases old_log_prob update_actor --mini-batches 1 --response-lengths $L --config $C > $R/g$g.log 2>&1
  echo "gpu $g alone rc $? $(( $(date +%s) - s )) s" | tee -a $R/runs.txt
done
ls -la $R $R/w4 | head -40
