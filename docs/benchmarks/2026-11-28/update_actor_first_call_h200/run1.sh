#!/usr/bin/env bash
# stop 49, call 1 (one H200): the 7B update_actor profiled on a slice of its per-GPU work; the decode
# matmuls at the 7B's tensor-parallel shapes; the GPU tests of the sampler check.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $R/gpu.txt
git log -1 --format=%H > $R/commit.txt 2>/dev/null
C7="actor_rollout_ref.model.path=r1-distill-qwen-7b data.max_prompt_length=150 data.max_response_length=9800
 actor_rollout_ref.rollout.n=9 data.train_batch_size=1 actor_rollout_ref.actor.ppo_mini_batch_size=1
 actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30000
 actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=30000
 actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=30000
 actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.model.enable_gradient_checkpointing=True
 actor_rollout_ref.actor.fsdp_config.optimizer_offload=True actor_rollout_ref.ref.fsdp_config.param_offload=True
 actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.rollout.temperature=0.6
 actor_rollout_ref.rollout.free_cache_engine=True"
(cd benchmarks && timeout 330 python3 update_profile.py $R/up7b --rounds 1 --phases update_actor --config $C7) > $R/up7b.log 2>&1
echo "up7b rc $?" >> $R/rc.txt
(cd benchmarks && timeout 120 python3 decode_kernels_tune.py $R/dkt_7b_tp2.json --model r1-distill-qwen-7b --tp 2 --shapes --matmul-rows 64 32 8 2 --split-matmul-rows 8) > $R/dkt.log 2>&1
echo "dkt rc $?" >> $R/rc.txt
timeout 100 python3 -m pytest -q -p no:cacheprovider -p pytest_rlbench.plugin tests/test_fast_engine.py -k "sampler_check or graph_replay" > $R/tests.log 2>&1
echo "tests rc $?" >> $R/rc.txt
tar czf $OUT/r1.tgz -C $OUT r
