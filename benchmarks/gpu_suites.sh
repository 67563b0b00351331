#!/usr/bin/env bash
# The suites on one GPU at the shapes recorded in docs/benchmarks.md. Every figure there comes from
# one of these pytest commands; this script only fixes their options so a run can be repeated.
#
#   bash benchmarks/gpu_suites.sh OUT_DIR step16x8     # 16 prompts x 8, prompt 256 + response 1024, fast engine
#   bash benchmarks/gpu_suites.sh OUT_DIR step16x8-liger  # the training phases and step with use_liger=True
#   bash benchmarks/gpu_suites.sh OUT_DIR step16x8-all-liger  # every phase with use_liger=True (needs liger-kernel)
#   bash benchmarks/gpu_suites.sh OUT_DIR hf16x8       # the same prompts through the hf engine (generation only)
#   RL_SESSIONS=3 bash benchmarks/gpu_suites.sh OUT_DIR noise16x8  # step16x8-all-liger's session again and again,
#                                                      # 5 rounds each: how much each phase moves (issue 29)
#   bash benchmarks/gpu_suites.sh OUT_DIR panel16x8    # fast, hf and static side by side (tokens/s, fidelity)
#   bash benchmarks/gpu_suites.sh OUT_DIR trl16x8      # the step16x8 step by ours and by TRL's GRPOTrainer, in one
#                                                      # session, side by side (needs trl: the [trl] extra)
#   bash benchmarks/gpu_suites.sh OUT_DIR gen128x14k   # 128 responses of 14,336 tokens: generation only
#   RL_GPUS=2 bash benchmarks/gpu_suites.sh OUT_DIR scale16x8  # step16x8's work per GPU on RL_GPUS GPUs of
#                                                      # one node (step only): the step's scaling
#   RL_NODES=2 bash benchmarks/gpu_suites.sh OUT_DIR scale16x8  # the same on RL_NODES Ray nodes of RL_GPUS
#                                                      # (default 1) GPUs each, started on this host by
#                                                      # benchmarks/ray_nodes.py (one node per GPU)
#   RL_GPUS=2 bash benchmarks/gpu_suites.sh OUT_DIR save16x8  # save_checkpoint at step16x8 on RL_GPUS GPUs
#                                                      # (sharded: each worker writes its own shard)
#   bash benchmarks/gpu_suites.sh OUT_DIR memory       # gradient checkpointing, optimizer offload, param offload
#   bash benchmarks/gpu_suites.sh OUT_DIR ckpt16x8-full ckpt16x8-save_attention ckpt16x8-save_matmuls
#                                                      # update_actor at step16x8 with gradient checkpointing on,
#                                                      # under the policy the shape names (one report each)
#   bash benchmarks/gpu_suites.sh OUT_DIR replay-gen replay-gen-uniform replay-step replay-step-uniform replay-phases
#                                                      # VERL v0.5.0's 1.5B work per GPU (--rl-workload), in
#                                                      # parts that each fit a 10-minute command; replay-phases
#                                                      # runs the -k expression in REPLAY_PHASES when set; a
#                                                      # replay shape may end in -packed (use_remove_padding)
#                                                      # and/or -liger (use_liger), and -mlp or -mlpN (the mlp
#                                                      # checkpointing policy, on the first N layers), e.g.
#                                                      # replay-step-packed-liger, replay-step-uniform-liger-mlp20;
#                                                      # RL_GPUS=N runs them on N GPUs of the node, each doing
#                                                      # the baseline's work per GPU
#   bash benchmarks/gpu_suites.sh OUT_DIR replay7b-step  # VERL f252da3's 7B work per GPU (--rl-workload
#                                                      # verl-7b) on the node's 4 GPUs: one step, every phase
#                                                      # gated from inside it, save_checkpoint after it
#                                                      # (trainer.save_freq=1); the actor's parameters stay on
#                                                      # the GPUs (param_offload=False: memory placement, not
#                                                      # work); fits one 10-minute command on 4 H200s
#                                                      # (replay7b-step-tp2: each share decoded by its 2 GPUs
#                                                      # together, tensor-parallel, as VERL's rollout did)
#   RL_GATE_PLAN="same update_actor:0.05" bash benchmarks/gpu_suites.sh OUT_DIR gate16x8  # sessions
#                                                      # for the GPU gate's error rates (see the shape)
#   RL_GATE_PLAN="same same update_actor:0.25" bash benchmarks/gpu_suites.sh OUT_DIR gate-default  # the same,
#                                                      # on the embedded default's tiny model (host-bound phases);
#                                                      # RL_GATE_AGAINST=B.json gates each session live on B;
#                                                      # RL_NODES=2: across 2 Ray nodes of one GPU each
#   RL_GATE_PLAN="same update_actor:0.05 same same" bash benchmarks/gpu_suites.sh OUT_DIR gate16x8-each-gpu
#                                                      # gate16x8, one entry per GPU of the host, at once
#   bash benchmarks/gpu_suites.sh OUT_DIR gate16x4     # the gate on one GPU: a baseline, 3 same-code reruns gated
#                                                      # against it, and one with old_log_prob 25% slower
#                                                      # (benchmarks/gate_slow_phase.py); one report each
#   bash benchmarks/gpu_suites.sh OUT_DIR replay-update-full replay-update-save_attention replay-update-save_matmuls
#                                                      # update_actor alone at the replay shape (its gradient
#                                                      # checkpointing on) under the policy the shape names;
#                                                      # replay-update-mlp14: the mlp policy on 14 layers
#
# The package must be importable (pip install -e . or PYTHONPATH); with PYTHONPATH the plugin is
# loaded with -p pytest_rlbench.plugin, as it is not installed through its entry point.
set -euo pipefail
out=${1:?usage: gpu_suites.sh OUT_DIR SHAPE...}; shift
mkdir -p "$out"
# RL_NODES=N (the shapes that take it: scale16x8, gate-default): the whole script runs again against N
# Ray nodes that benchmarks/ray_nodes.py starts on this host, node i seeing GPU i alone, and stops after
if [ -n "${RL_NODES:-}" ] && [ -z "${RAY_ADDRESS:-}" ]; then
    exec python3 benchmarks/ray_nodes.py --logs "$out/ray-nodes" "$RL_NODES" -- bash "$0" "$out" "$@"
fi
nodes=(); [ -n "${RL_NODES:-}" ] && nodes=(--rl-nodes "$RL_NODES")
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
plugin=()
python3 -c "import importlib.metadata as m; assert any(e.name == 'rlbench' for e in m.entry_points(group='pytest11'))" 2>/dev/null \
    || plugin=(-p pytest_rlbench.plugin)
data=/tmp/rlbench-p256.parquet
[ -f "$data" ] || python3 benchmarks/long_prompts.py "$data" --rows 512 --prompt-tokens 256
common=(-q -p no:cacheprovider "${plugin[@]}" --gpu --rl-model r1-distill-qwen-1.5b --rl-dataset "$data"
        --rl-config data.max_prompt_length=256 --rl-config actor_rollout_ref.rollout.ignore_eos=True
        --rl-config actor_rollout_ref.actor.use_kl_loss=True --rl-config actor_rollout_ref.rollout.n=8)
batch16=(--rl-config data.train_batch_size=16 --rl-config actor_rollout_ref.actor.ppo_mini_batch_size=16
         --rl-config actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8
         --rl-config actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
         --rl-config actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16)
# gate_sessions PREFIX PYTEST_ARGS...: one session of PYTEST_ARGS per RL_GATE_PLAN entry, its report
# PREFIX-NN-<entry>.json; each also saves itself as a baseline (NAME.baseline.json), so it counts each
# phase's work in one more, untimed, round. Entries: same (unchanged code), or METHOD[,METHOD]:FRACTION,
# those GRPOTrainer methods made FRACTION slower by real GPU work (benchmarks/gate_slow_phase.py).
# RL_GATE_AGAINST=BASELINE.json: each session is also gated live against that baseline (--rl-baseline),
# so its gate tests judge it as a CI job would (a session whose gate failed saves no baseline of its own).
gate_sessions() {
    local prefix=$1 i=0 entry name against=()
    shift
    [ -n "${RL_GATE_AGAINST:-}" ] && against=(--rl-baseline "$RL_GATE_AGAINST")
    for entry in ${RL_GATE_PLAN:-same}; do
        i=$((i + 1)); name="$prefix-$(printf %02d $i)-${entry//[:,]/_}"
        local kept=(--rl-report "$out/$name.json" --rl-save-baseline "$out/$name.baseline.json" "${against[@]}")
        if [ "$entry" = same ]; then
            python3 -m pytest "$@" "${kept[@]}" > "$out/$name.log" 2>&1 || true
        else
            GATE_SLOW_METHOD="${entry%%:*}" GATE_SLOWDOWN="${entry##*:}" GATE_SLOW_GPU=1 \
            PYTHONPATH="$PWD/benchmarks:${PYTHONPATH:-}" python3 -m pytest -p gate_slow_phase "$@" \
                "${kept[@]}" > "$out/$name.log" 2>&1 || true
        fi
        tail -n 3 "$out/$name.log"
    done
}
for shape in "$@"; do
    echo "== $shape"
    case "$shape" in
    step16x8)
        python3 -m pytest "${common[@]}" "${batch16[@]}" --rl-config data.max_response_length=1024 \
            suites/test_phases.py suites/test_step.py -k "not save_checkpoint" \
            --rl-rollout fast --rl-rounds 2 --rl-warmup-rounds 1 --rl-report "$out/step16x8.json" ;;
    step16x8-liger)  # the same with liger-kernel's fused RMSNorm, SwiGLU and RoPE (needs liger-kernel)
        python3 -m pytest "${common[@]}" "${batch16[@]}" --rl-config data.max_response_length=1024 \
            --rl-config actor_rollout_ref.model.use_liger=True \
            suites/test_phases.py suites/test_step.py -k "not save_checkpoint and not generate and not test_gen" \
            --rl-rollout fast --rl-rounds 2 --rl-warmup-rounds 1 --rl-report "$out/step16x8-liger.json" ;;
    step16x8-all-liger)  # every phase of step16x8 (generation too) with use_liger=True: the issue-15 table's
        # row at this shape with every speed option that is faster here (the fused decode is on by default)
        python3 -m pytest "${common[@]}" "${batch16[@]}" --rl-config data.max_response_length=1024 \
            --rl-config actor_rollout_ref.model.use_liger=True \
            suites/test_phases.py suites/test_step.py -k "not save_checkpoint" \
            --rl-rollout fast --rl-rounds 2 --rl-warmup-rounds 1 --rl-report "$out/step16x8-all-liger.json" ;;
    noise16x8)  # issue 29's noise: step16x8-all-liger's session RL_SESSIONS times (default 3), 5 rounds each
        for i in $(seq 1 "${RL_SESSIONS:-3}"); do
            python3 -m pytest "${common[@]}" "${batch16[@]}" --rl-config data.max_response_length=1024 \
                --rl-config actor_rollout_ref.model.use_liger=True \
                suites/test_phases.py suites/test_step.py -k "not save_checkpoint" \
                --rl-rollout fast --rl-rounds 5 --rl-warmup-rounds 1 --rl-report "$out/noise16x8-$i.json"
        done ;;
    panel16x8)  # the rollout panel: fast (trains), hf and static on the same prompts, seed and weights
        python3 -m pytest "${common[@]}" "${batch16[@]}" --rl-config data.max_response_length=1024 \
            suites/test_rollout_panel.py --rl-rollout fast --rl-rollout hf --rl-rollout static \
            --rl-rounds 1 --rl-warmup-rounds 1 --rl-report "$out/panel16x8.json" ;;
    trl16x8)  # issue 17: both frameworks' whole step, beta 0.001 (kl_loss_coef's default), bf16, phase by
        # phase from each step's own timing; TRL's step is ~150 s, so 1 warm-up + 1 timed round each and
        # no phase benchmarks (each would replay TRL's generation). Offline: the model is a preset's
        # config with random weights, saved locally for TRL; nothing is fetched from the Hub.
        HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
        python3 -m pytest "${common[@]}" "${batch16[@]}" --rl-config data.max_response_length=1024 \
            suites/test_step.py --rl-trainer ours --rl-trainer trl --rl-rollout fast --rl-gpus-per-node 1 \
            --rl-rounds 1 --rl-warmup-rounds 1 --rl-report "$out/trl16x8.json" ;;
    scale16x8)  # 16 prompts x 8 = 128 responses per GPU (the seed's per-GPU batch) on RL_GPUS GPUs (of each
        # of RL_NODES nodes): the global batch grows with the GPUs, each GPU's micro-batches stay step16x8's
        per=${RL_GPUS:-1}; n=$(( ${RL_NODES:-1} * per ))
        name=scale16x8-${n}gpu; [ -n "${RL_NODES:-}" ] && name=scale16x8-${RL_NODES}x${per}gpu
        python3 -m pytest "${common[@]}" --rl-config data.max_response_length=1024 \
            --rl-config data.train_batch_size=$((16 * n)) --rl-config actor_rollout_ref.actor.ppo_mini_batch_size=$((16 * n)) \
            "${batch16[@]:4}" suites/test_step.py --rl-nodes "${RL_NODES:-1}" --rl-gpus-per-node "$per" \
            --rl-rollout fast --rl-rounds 2 --rl-warmup-rounds 1 --rl-report "$out/$name.json" ;;
    save16x8)  # save_checkpoint at step16x8 on RL_GPUS GPUs of one node (each worker writes its own
        # shard of the model and optimizer); one step directory kept, under RL_CKPT_DIR when set
        n=${RL_GPUS:-1}
        ckpt=(); [ -n "${RL_CKPT_DIR:-}" ] && ckpt=(--rl-config "trainer.default_local_dir=$RL_CKPT_DIR")
        python3 -m pytest "${common[@]}" "${batch16[@]}" --rl-config data.max_response_length=1024 \
            --rl-config trainer.max_actor_ckpt_to_keep=1 "${ckpt[@]}" suites/test_phases.py -k save_checkpoint \
            --rl-nodes 1 --rl-gpus-per-node "$n" --rl-rollout fast --rl-rounds 3 --rl-warmup-rounds 1 \
            --rl-report "$out/save16x8-${n}gpu.json" ;;
    hf16x8)
        python3 -m pytest "${common[@]}" "${batch16[@]}" --rl-config data.max_response_length=1024 \
            suites/test_phases.py -k test_generate_sequences \
            --rl-rollout hf --rl-rounds 1 --rl-warmup-rounds 1 --rl-report "$out/hf16x8.json" ;;
    gen128x14k)
        python3 -m pytest "${common[@]}" "${batch16[@]}" --rl-config data.max_response_length=14336 \
            suites/test_phases.py -k test_generate_sequences \
            --rl-rollout fast --rl-rounds 1 --rl-warmup-rounds 0 --rl-report "$out/gen128x14k.json" ;;
    ckpt16x8-*)  # actor_rollout_ref.model.gradient_checkpointing_policy: what the recompute skips
        python3 -m pytest "${common[@]}" "${batch16[@]}" --rl-config data.max_response_length=1024 \
            --rl-config actor_rollout_ref.model.enable_gradient_checkpointing=True \
            --rl-config "actor_rollout_ref.model.gradient_checkpointing_policy=${shape#ckpt16x8-}" \
            suites/test_phases.py -k update_actor \
            --rl-rollout fast --rl-rounds 2 --rl-warmup-rounds 1 --rl-report "$out/$shape.json" ;;
    memory)
        for opt in actor_rollout_ref.model.enable_gradient_checkpointing=True \
                   actor_rollout_ref.actor.fsdp_config.optimizer_offload=True \
                   actor_rollout_ref.actor.fsdp_config.param_offload=True; do
            name=memory-${opt%%=*}; name=${name##*.}
            python3 -m pytest "${common[@]}" "${batch16[@]}" --rl-config data.max_response_length=256 \
                --rl-config "$opt" suites/test_step.py --rl-rollout fast --rl-rounds 1 --rl-warmup-rounds 0 \
                --rl-report "$out/$name.json"
        done ;;
    replay7b-step|replay7b-step-tp2)  # one round: gen alone is ~183 s on 4 H200s, the whole step ~318 s with its save
        # -tp2: each share's two GPUs decode it together, tensor-parallel (rollout.tensor_model_parallel_size=2)
        tp=(); [[ $shape == *-tp2 ]] && tp=(--rl-config actor_rollout_ref.rollout.tensor_model_parallel_size=2)
        python3 -m pytest -q -p no:cacheprovider "${plugin[@]}" --gpu --rl-workload verl-7b --rl-rollout fast "${tp[@]}" \
            --rl-gpus-per-node "${RL_GPUS:-4}" --rl-config actor_rollout_ref.rollout.free_cache_engine=True \
            --rl-config actor_rollout_ref.model.use_remove_padding=True --rl-config actor_rollout_ref.model.use_liger=True \
            --rl-config actor_rollout_ref.actor.fsdp_config.param_offload=False --rl-config trainer.save_freq=1 \
            suites/test_step.py --rl-rounds 1 --rl-warmup-rounds 0 --rl-report "$out/$shape.json" ;;
    replay-*)
        # free_cache_engine (VERL's key): the engine's KV cache for 64 x 27k tokens (~51 GB) is released
        # after generation, as VERL releases vLLM's, so the update fits beside the optimizer state.
        # A shape may end in -packed (use_remove_padding=True), -liger (use_liger=True) and -mlp or -mlpN
        # (gradient_checkpointing_policy=mlp, on the first N layers: gradient_checkpointing_layers=N).
        base=$shape; extra=()
        while :; do
            case "$base" in
            *-packed) extra+=(--rl-config actor_rollout_ref.model.use_remove_padding=True); base=${base%-packed} ;;
            *-liger) extra+=(--rl-config actor_rollout_ref.model.use_liger=True); base=${base%-liger} ;;
            *-mlp) extra+=(--rl-config actor_rollout_ref.model.gradient_checkpointing_policy=mlp); base=${base%-mlp} ;;
            *-mlp[0-9]*)  # the MLP policy on the first N layers only (gradient_checkpointing_layers=N)
                n=${base##*-mlp}; base=${base%-mlp*}
                extra+=(--rl-config actor_rollout_ref.model.gradient_checkpointing_policy=mlp
                        --rl-config "actor_rollout_ref.model.gradient_checkpointing_layers=$n") ;;
            *) break ;;
            esac
        done
        # RL_GPUS (default 1): the GPUs of the node it runs on, each doing the baseline's work per GPU
        replay=(-q -p no:cacheprovider "${plugin[@]}" --gpu --rl-workload verl-v0.5.0-1.5b --rl-rollout fast
                --rl-gpus-per-node "${RL_GPUS:-1}"
                --rl-config actor_rollout_ref.rollout.free_cache_engine=True "${extra[@]}"
                --rl-rounds 1 --rl-warmup-rounds 0 --rl-report "$out/$shape.json")
        uniform=(--rl-config actor_rollout_ref.rollout.target_lengths.distribution=constant)
        case "$base" in
        replay-gen) python3 -m pytest "${replay[@]}" suites/test_phases.py -k "test_gen and not generate" ;;
        replay-gen-uniform)  # the same, every response at the published mean: the length shape's weight
            python3 -m pytest "${replay[@]}" suites/test_phases.py -k "test_gen and not generate" "${uniform[@]}" ;;
        replay-step) python3 -m pytest "${replay[@]}" suites/test_step.py ;;
        replay-step-uniform)  # the step with every response at the published mean (issue 15's uniform row)
            python3 -m pytest "${replay[@]}" suites/test_step.py "${uniform[@]}" ;;
        replay-phases) python3 -m pytest "${replay[@]}" suites/test_phases.py -k "${REPLAY_PHASES:-old_log_prob or test_ref or update_actor}" ;;
        replay-update)  # update_actor under the policy an -mlp / -mlpN suffix chose
            python3 -m pytest "${replay[@]}" suites/test_phases.py -k update_actor ;;
        replay-update-*)  # the workload turns gradient checkpointing on; the shape names its policy
            python3 -m pytest "${replay[@]}" suites/test_phases.py -k update_actor \
                --rl-config "actor_rollout_ref.model.gradient_checkpointing_policy=${base#replay-update-}" ;;
        *) echo "unknown shape $shape" >&2; exit 2 ;;
        esac ;;
    gate16x4)  # 16 prompts x 4, prompt 256 + response 128, every phase but save_checkpoint, 5 rounds
        g=("${common[@]}" --rl-config actor_rollout_ref.rollout.n=4 --rl-config data.max_response_length=128
           suites/test_phases.py suites/test_step.py -k "not save_checkpoint" --rl-rollout fast)
        python3 -m pytest "${g[@]}" --rl-save-baseline "$out/gate16x4-base.json"
        for i in 1 2 3; do  # a regression exits 1: the next session still runs
            python3 -m pytest "${g[@]}" --rl-baseline "$out/gate16x4-base.json" --rl-report "$out/gate16x4-rerun$i.json" || true
        done
        PYTHONPATH="$PWD/benchmarks:${PYTHONPATH:-}" python3 -m pytest -p gate_slow_phase "${g[@]}" \
            --rl-baseline "$out/gate16x4-base.json" --rl-report "$out/gate16x4-slow.json" || true ;;
    gate16x8)  # issue 29's error rates: step16x8-all-liger sessions, one per RL_GATE_PLAN entry, each
        # report kept (every round, the GPU telemetry) to be judged against the others afterwards
        # (benchmarks/gate_gpu_rates.py); entries and baselines as gate_sessions says.
        gate_sessions gate16x8 "${common[@]}" "${batch16[@]}" --rl-config data.max_response_length=1024 \
            --rl-config actor_rollout_ref.model.use_liger=True suites/test_phases.py suites/test_step.py \
            -k "not save_checkpoint" --rl-rollout fast --rl-rounds 5 --rl-warmup-rounds 1 ;;
    gate-default)  # as gate16x8, on the embedded default (its tiny model, `pytest suites/ --gpu`): the
        # GPU gate where every phase waits on the host (tens of ms a round). Reports gatedefault-NN-ENTRY.json
        gate_sessions gatedefault -q -p no:cacheprovider "${plugin[@]}" --gpu "${nodes[@]}" suites/ ;;
    gate16x8-each-gpu)  # gate16x8 once per GPU of this host, at the same time: RL_GATE_PLAN's entries one
        # per GPU (CUDA_VISIBLE_DEVICES=0, 1, ...; each session its own Ray), reports under OUT/gpuN/. As
        # many sessions as GPUs in the time of one. Sharing the host's CPUs unpinned, four sessions ran
        # their host-side phases slower than alone (reward 89-238 ms against 42; docs/benchmarks.md,
        # "Counted work decides"): each session now runs on its own share of the cores this script may
        # use (taskset; a physical core's hyperthreads stay together), so that none runs on another's.
        # The machine watch still sees the others' CPU use and names it beside a failure (it never turns
        # one into a pass). Untried so far: check its reward and adv against a session alone before
        # counting its unchanged sessions.
        read -r -a entries <<< "${RL_GATE_PLAN:-same}"
        [ "${#entries[@]}" -gt 0 ] || entries=(same)
        mapfile -t shares < <(python3 - "${#entries[@]}" <<'PY'
import os, sys
n = int(sys.argv[1])
def core(cpu):  # (package, core): hyperthreads of one physical core share it
    top = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
    read = lambda name: int(open(top + name).read()) if os.path.exists(top + name) else cpu
    return read("physical_package_id"), read("core_id"), cpu
cpus = sorted(os.sched_getaffinity(0), key=core)
share = len(cpus) // n
if share < 1:
    sys.exit(f"gate16x8-each-gpu: {len(cpus)} cores for {n} sessions")
for i in range(n):
    print(",".join(map(str, sorted(cpus[i * share:(i + 1) * share]))))
PY
        )
        [ "${#shares[@]}" -eq "${#entries[@]}" ] || exit 2
        for i in "${!entries[@]}"; do
            CUDA_VISIBLE_DEVICES=$i RL_GATE_PLAN="${entries[$i]}" \
                taskset -c "${shares[$i]}" bash "$0" "$out/gpu$i" gate16x8 > "$out/gpu$i.out" 2>&1 &
        done
        wait
        tail -n 3 "$out"/gpu*.out ;;
    *) echo "unknown shape $shape" >&2; exit 2 ;;
    esac
done
