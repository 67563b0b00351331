#!/usr/bin/env bash
# .whl/ab/ held the variants: git show eaf0b4f:trainer/workers/train_worker.py > train_worker_eaf0b4f.py, and
# training_warm_up.py of eaf0b4f (the warm-up after review) and of 00205b8 (its first version); "new" is this tree
# one H200: the training phases' first-call cost (first call - a later call) left by each training warm-up, each
# variant in its own copy of the tree with its own empty Triton cache, on the 1.5B replay's first mini-batch (16 rows)
set -u
o=/tmp/o2; mkdir -p $o
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
for v in none eaf0b4f 00205b8 new; do
  d=/tmp/tree_$v; rm -rf $d; mkdir -p $d; cp -r benchmarks trainer pytest_rlbench suites conftest.py pyproject.toml $d/
  case $v in
    none) sed -i 's/training_warm_up = self._warm_up_training() if on_gpu else 0.0/training_warm_up = 0.0/' $d/trainer/workers/train_worker.py ;;
    eaf0b4f) cp .whl/ab/train_worker_eaf0b4f.py $d/trainer/workers/train_worker.py; cp .whl/ab/training_warm_up_eaf0b4f.py $d/trainer/workers/training_warm_up.py ;;
    00205b8) cp .whl/ab/train_worker_eaf0b4f.py $d/trainer/workers/train_worker.py; cp .whl/ab/training_warm_up_00205b8.py $d/trainer/workers/training_warm_up.py ;;
  esac
  grep -c "_warm_up_training()" $d/trainer/workers/train_worker.py > $o/$v.calls
  s=$(date +%s)
  (cd $d && export PYTHONPATH=/tmp/site:$d NCCL_NVLS_ENABLE=0 TRITON_CACHE_DIR=/tmp/tc_$v &&    timeout 130 python3 benchmarks/update_profile.py $o/$v --rounds 1 --no-profile --mini-batches 1 --response-lengths $L --config $C) > $o/$v.log 2>&1
  echo "$v rc $? $(( $(date +%s) - s )) s" | tee -a $o/runs.txt
  python3 -c "
import json,sys
r=json.load(open('$o/$v/update_profile.json'))
ph=r.get('phases', r)
for k,v in (ph.items() if isinstance(ph,dict) else []):
    if isinstance(v,dict) and 'first_call_s' in v: print('$v', k, 'first', round(v['first_call_s'],2), 'median', round(v['median_s'],2), 'excess', round(v['first_call_s']-v['median_s'],2))
" 2>&1 | tee -a $o/summary.txt
done
tar czf $OUT/f.tar.gz -C $o .
