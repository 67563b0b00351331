#!/usr/bin/env bash
# stop 49, call 2 (two H200s): the 7B update_actor on the same per-GPU slice as call 1, FSDP2 over 2
# GPUs; the 2-GPU one-shot test with its log-prob assertion.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $R/gpu.txt
nvidia-smi topo -m > $R/topo.txt
C7="actor_rollout_ref.model.path=r1-distill-qwen-7b data.max_prompt_length=150 data.max_response_length=9800
 actor_rollout_ref.rollout.n=9 data.train_batch_size=1 actor_rollout_ref.actor.ppo_mini_batch_size=1
 actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30000
 actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=30000
 actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=30000
 actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.model.enable_gradient_checkpointing=True
 actor_rollout_ref.actor.fsdp_config.optimizer_offload=True actor_rollout_ref.ref.fsdp_config.param_offload=True
 actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.rollout.temperature=0.6
 actor_rollout_ref.rollout.free_cache_engine=True"
(cd benchmarks && timeout 400 python3 update_profile.py $R/up7b_w2 --world 2 --rounds 2 --phases old_log_prob update_actor --config $C7) > $R/up7b_w2.log 2>&1
echo "up7b_w2 rc $?" >> $R/rc.txt
timeout 120 python3 -m pytest -q -p no:cacheprovider -p pytest_rlbench.plugin tests/test_tensor_parallel_decode.py > $R/tests_tp.log 2>&1
echo "tests_tp rc $?" >> $R/rc.txt
tar czf $OUT/r2.tgz -C $OUT r
