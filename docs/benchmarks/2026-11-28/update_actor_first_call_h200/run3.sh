#!/usr/bin/env bash
# stop 49, call 3 (one H200): old_log_prob and update_actor of the 7B on the rows of the 4-H200 replay's
# heaviest worker (share 20's first 32 rows: 392,089 response tokens, up to 27,648), without decoding them.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $R/gpu.txt
L="4543 18022 27648 21103 13944 14415 5632 4541 7422 9856 7170 7768 8587 12817 4123 10512 18797 7345 4566 7718 4002 17793 27648 12429 19245 27648 11841 7562 5321 14832 14118 13121"
C7="actor_rollout_ref.model.path=r1-distill-qwen-7b data.max_prompt_length=150 data.max_response_length=27648
 actor_rollout_ref.rollout.n=16 data.train_batch_size=2 actor_rollout_ref.actor.ppo_mini_batch_size=1
 actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30000
 actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=30000
 actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=30000
 actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.model.enable_gradient_checkpointing=True
 actor_rollout_ref.actor.fsdp_config.optimizer_offload=True actor_rollout_ref.ref.fsdp_config.param_offload=True
 actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.rollout.temperature=0.6
 actor_rollout_ref.rollout.free_cache_engine=True"
(cd benchmarks && timeout 560 python3 update_profile.py $R/up7b_ragged --rounds 1 --phases old_log_prob update_actor --response-lengths $L --mini-batches 4 --config $C7) > $R/up7b_ragged.log 2>&1
echo "up7b_ragged rc $?" >> $R/rc.txt
tar czf $OUT/r3.tgz -C $OUT r
