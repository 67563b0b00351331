#!/usr/bin/env bash
# stop 50, call 1 (one H200): the moments' pinned reservation made last in set-up (after the offloaded
# ref), on the 4-H200 7B replay's heaviest worker's rows; then the GPU tests left from stop 49 and the
# fidelity panel's fast engine.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
R=$OUT/r; mkdir -p $R
left() { echo $(( 585 - SECONDS )); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
L=$(cd benchmarks && python3 replay_draws.py --workload verl-7b --worker-rows 4 --lengths-of 2 2>$R/draws.err)
echo "$L" > $R/lengths.txt
C7="actor_rollout_ref.model.path=r1-distill-qwen-7b data.max_prompt_length=150 data.max_response_length=27648
 actor_rollout_ref.rollout.n=16 data.train_batch_size=2 actor_rollout_ref.actor.ppo_mini_batch_size=1
 actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30000
 actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=30000
 actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=30000
 actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.model.enable_gradient_checkpointing=True
 actor_rollout_ref.actor.fsdp_config.optimizer_offload=True actor_rollout_ref.ref.fsdp_config.param_offload=True
 actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.rollout.temperature=0.6
 actor_rollout_ref.rollout.free_cache_engine=True"
(cd benchmarks && timeout 300 python3 update_profile.py $R/up7b_reserved_last --rounds 1 --no-profile --phases update_actor --response-lengths $L --mini-batches 4 --config $C7) > $R/up7b_reserved_last.log 2>&1
echo "up7b rc $? at $SECONDS s" >> $R/rc.txt
timeout $(left) python3 -m pytest -q -p no:cacheprovider -p pytest_rlbench.plugin tests/test_optimizer_offload.py > $R/tests_offload.log 2>&1; echo "offload tests rc $? at $SECONDS s" >> $R/rc.txt
timeout $(left) python3 -m pytest -q -p no:cacheprovider -p pytest_rlbench.plugin tests/test_fast_engine.py -k "sampler_check or graph_replay" > $R/tests_fast_engine.log 2>&1; echo "fast engine tests rc $? at $SECONDS s" >> $R/rc.txt
timeout $(left) python3 benchmarks/gpu_fidelity.py $R/fid --engines fast > $R/fidelity.log 2>&1; echo "fidelity rc $? at $SECONDS s" >> $R/rc.txt
tar czf $OUT/r1.tgz -C $OUT r
