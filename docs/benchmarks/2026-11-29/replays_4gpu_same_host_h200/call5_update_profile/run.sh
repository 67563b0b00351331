# call 5 (nvidia-h200-x4, a fresh machine): `bash run.sh 230 'bash THIS'`; as call 4, with one OpenMP thread a worker
L="11406 13691 9965 12153 25510 17141 9283 12895 17906 27648 27267 12140 6909 22371 12691 8103"
C="actor_rollout_ref.model.path=r1-distill-qwen-1.5b data.max_prompt_length=148 data.max_response_length=27648 actor_rollout_ref.rollout.n=16 data.train_batch_size=1 actor_rollout_ref.actor.ppo_mini_batch_size=1 actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30000 actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=30000 actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=30000 actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.model.enable_gradient_checkpointing=True actor_rollout_ref.model.gradient_checkpointing_policy=mlp actor_rollout_ref.model.gradient_checkpointing_layers=14 actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.rollout.free_cache_engine=True"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid --format=csv > $R/gpus.csv
for w in 4 1; do
  s=$(date +%s)
  OMP_NUM_THREADS=1 timeout 110 python3 benchmarks/update_profile.py $R/t1w$w --world $w --no-profile --rounds 2 --phases old_log_prob update_actor --mini-batches 1 --response-lengths $L --config $C > $R/t1w$w.log 2>&1
  echo "OMP 1 world $w rc $? $(( $(date +%s) - s )) s" | tee -a $R/runs.txt
done
