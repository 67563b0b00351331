# the mixed packed path (long rows alone, short together) against every row of such a micro-batch in the
# flash kernel, on the rows of worker 1 of the 1.5B replay on 2 GPUs at step 0 (replay_draws.py
# --worker-rows 2 --steps 0 --lengths-of 1: 64 rows, 4 under 6,144 tokens), one GPU, old_log_prob and update_actor
L="23462 19954 12011 7976 24379 18970 21672 14052 16526 5755 8264 8649 4218 27648 9792 12585 8872 18765 23171 27648 10949 5191 14425 11398 7232 27648 13335 15993 3058 11356 16566 25079 11406 13691 17141 9283 12895 27648 27267 22371 12691 8103 7873 27648 17718 7983 14852 8733 22484 13297 14205 10668 12837 16694 18591 11743 26159 14696 22775 15498 9885 14359 7731 27648"
C="actor_rollout_ref.model.path=r1-distill-qwen-1.5b data.max_prompt_length=148 data.max_response_length=27648 actor_rollout_ref.rollout.n=16 data.train_batch_size=4 actor_rollout_ref.actor.ppo_mini_batch_size=1 actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30000 actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=30000 actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=30000 actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.model.enable_gradient_checkpointing=True actor_rollout_ref.model.gradient_checkpointing_policy=mlp actor_rollout_ref.model.gradient_checkpointing_layers=14 actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.rollout.free_cache_engine=True"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,uuid --format=csv > $R/gpus.csv
s=$(date +%s); timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_packed_rows.py > $R/tests_gpu.log 2>&1; echo "tests rc $? $(( $(date +%s) - s )) s" | tee -a $R/runs.txt
tail -3 $R/tests_gpu.log
for variant in mixed flash mixed; do
  s=$(date +%s)
  if [ $variant = flash ]; then PRE="import trainer.models.packed_attention as p; p._long_alone_short_together = lambda q, k, v, b, s, t: p._varlen_group(q, k, v, b, s);"; else PRE=""; fi
  timeout 200 python3 -c "$PRE import runpy, sys; sys.argv = ['update_profile.py'] + sys.argv[1:]; runpy.run_path('benchmarks/update_profile.py', run_name='__main__')" $R/$variant$s --no-profile --rounds 1 --phases old_log_prob update_actor --mini-batches 4 --response-lengths $L --config $C > $R/$variant$s.log 2>&1
  echo "$variant rc $? $(( $(date +%s) - s )) s" | tee -a $R/runs.txt
  grep -h 'first_call_s\|median_s\|"update_actor"\|"old_log_prob"' $R/$variant$s.log
done
