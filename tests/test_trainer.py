"""The bundled trainer end to end on a real local Ray: it learns, it resumes exactly, its CLI runs.

These tests start Ray once (module fixture) and run real training steps of the tiny preset on CPU.
"""

from __future__ import annotations

import math
import statistics
import subprocess
import sys

import pytest
import ray
import torch

from trainer.batch import packing_pays
from trainer.build import build_trainer, ray_session
from trainer.config import build_config
from trainer.driver.checkpoint import load_checkpoint, step_dir
from trainer.driver.grpo_trainer import GRPOTrainer
from trainer.models.packed_attention import PACKED_ATTENTION
from trainer.phases import STEP_PHASES

TOY = [
    "data.synthetic_difficulty=tiny",
    "data.train_batch_size=16",
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=128",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=128",
    "actor_rollout_ref.actor.optim.weight_decay=0",
]


@pytest.fixture(scope="module")
def local_ray():
    with ray_session(num_cpus=2) as started:
        assert started and ray.is_initialized()
        yield
    assert not ray.is_initialized()  # the session that started Ray stops it


def make_trainer(overrides: list[str], workdir) -> GRPOTrainer:
    """The one harness: the synthetic set written into ``workdir``, then the trainer on the running Ray."""
    return build_trainer(build_config(TOY + overrides), workdir)


def test_grpo_raises_the_reward_of_a_seeded_run(local_ray, tmp_path):
    """The tiny preset learns to answer one-digit sums: reward well above its start in 40 steps."""
    trainer = make_trainer(["data.max_response_length=3", "actor_rollout_ref.actor.optim.lr=1e-2"], tmp_path)
    try:
        scores = [trainer.train_step(next(trainer.loader)).metrics["critic/score/mean"] for _ in range(40)]
    finally:
        trainer.shutdown()
    start, end = statistics.mean(scores[:5]), statistics.mean(scores[-10:])
    assert end >= start + 0.05 and end >= 2 * start, f"no learning: first 5 steps {start:.3f}, last 10 {end:.3f}: {scores}"


def test_a_step_records_every_phase_and_its_tokens(local_ray, tmp_path):
    trainer = make_trainer(
        ["data.max_response_length=8", "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.entropy_coeff=0.01"],
        tmp_path,
    )
    try:
        result = trainer.train_step(next(trainer.loader))
    finally:
        trainer.shutdown()
    assert set(STEP_PHASES) | {"step"} <= set(result.timing_s)
    inner = sum(result.timing_s[k] for k in ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor"))
    assert inner <= result.timing_s["step"]
    assert result.timing_s["reshard"] + result.timing_s["generate_sequences"] <= result.timing_s["gen"]
    assert result.tokens.num_sequences == 16 * 8
    assert result.tokens.response_tokens == sum(result.tokens.response_lengths) > 0
    assert result.tokens.decode_steps == max(result.tokens.response_lengths)  # one worker
    flat = result.flat()
    assert flat["tokens/total"] == flat["tokens/prompt"] + flat["tokens/response"]
    assert 1 <= result.metrics["response_length/mean"] <= 8
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/entropy", "actor/pg_clipfrac"):
        assert key in result.metrics
    assert_waits_fit_their_phases(result, workers=1)


WORKER_PHASES = ("reshard", "generate_sequences", "old_log_prob", "ref", "update_actor")


def assert_waits_fit_their_phases(result, workers: int) -> None:
    """Each worker phase's time outside its workers' calls (trainer/workers/phase_spans.py): the driver
    starts before any worker and ends after all, so no figure is negative and the wait to start and
    the way back fit in the phase; one worker's ends are 0 apart."""
    timed = [phase for phase in WORKER_PHASES if phase in result.timing_s]  # ref: with a KL term only
    assert {"reshard", "old_log_prob", "update_actor"} <= set(timed)
    for phase in timed:
        lag, spread, back = (result.metrics[f"workers/{f}/{phase}"] for f in ("start_lag_s", "end_spread_s", "collect_s"))
        assert min(lag, spread, back) >= 0, (phase, lag, spread, back)
        # the phase's seconds come from another clock (perf_counter): allow it 10 ms
        assert lag + back <= result.timing_s[phase] + 0.01, (phase, lag, back, result.timing_s[phase])
        if workers == 1:
            assert spread == 0.0, (phase, spread)


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm.adv_estimator=rloo", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum"],
        ["algorithm.adv_estimator=reinforce_plus_plus", "algorithm.use_kl_in_reward=True", "algorithm.kl_penalty=kl"],
        [
            "algorithm.adv_estimator=reinforce_plus_plus_baseline",
            "algorithm.use_kl_in_reward=True",
            "algorithm.kl_ctrl.type=adaptive",
            "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
        ],
        [
            "algorithm.norm_adv_by_std_in_grpo=False",
            "actor_rollout_ref.actor.use_dynamic_bsz=True",
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=400",
            "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
            "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=400",
            "actor_rollout_ref.actor.ppo_epochs=2",
        ],
    ],
    ids=["rloo", "reinforce++-kl-in-reward", "reinforce++-baseline-adaptive-kl", "dr-grpo-dynamic-bsz"],
)
def test_each_algorithm_variant_takes_a_finite_step(local_ray, tmp_path, overrides):
    trainer = make_trainer(["data.max_response_length=6", "actor_rollout_ref.actor.optim.lr=1e-3"] + overrides, tmp_path)
    try:
        result = trainer.train_step(next(trainer.loader))
    finally:
        trainer.shutdown()
    assert math.isfinite(result.metrics["actor/pg_loss"]) and result.metrics["actor/grad_norm"] > 0
    if "algorithm.use_kl_in_reward=True" in overrides:
        assert "actor/reward_kl_penalty" in result.metrics
        assert "ref" in result.timing_s


def test_a_packed_step_takes_the_padded_steps_figures(local_ray, tmp_path):
    """use_remove_padding=True through the workers: the same step as padded micro-batches, to float error."""
    ragged = ["data.max_response_length=96", "actor_rollout_ref.actor.use_kl_loss=True",
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
              "actor_rollout_ref.rollout.target_lengths.distribution=lognormal",
              "actor_rollout_ref.rollout.target_lengths.mean=24", "actor_rollout_ref.rollout.target_lengths.sigma=1.0"]
    results = {}
    for packed in (False, True):
        trainer = make_trainer(ragged + [f"actor_rollout_ref.model.use_remove_padding={packed}"], tmp_path / str(packed))
        try:
            assert trainer.workers.info[0]["attention"] == (PACKED_ATTENTION if packed else "sdpa")
            step = trainer.train_step(next(trainer.loader))
            results[packed], results["tokens"] = step.metrics, step.tokens
        finally:
            trainer.shutdown()
    # old_log_prob's one micro-batch of all 128 rows had padding enough to be packed (trainer.batch.packing_pays)
    tokens = results["tokens"]
    rows = [p + r for p, r in zip(tokens.prompt_lengths, tokens.response_lengths, strict=True)]
    assert packing_pays(rows), rows
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/pg_clipfrac"):
        assert results[True][key] == pytest.approx(results[False][key], rel=1e-4, abs=1e-7), key


def test_two_workers_decoding_as_one_group_take_the_same_step(local_ray, tmp_path):
    """rollout.tensor_model_parallel_size=2 over two CPU workers (gloo): the workers join a decode group,
    each holds half of every layer, and the step is the one two separate engines take, to float error;
    the group decodes for its longest row once, where two engines each decode for their own."""
    ragged = ["trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.name=fast", "data.max_response_length=48",
              "actor_rollout_ref.rollout.target_lengths.distribution=lognormal",
              "actor_rollout_ref.rollout.target_lengths.mean=16", "actor_rollout_ref.rollout.target_lengths.sigma=1.0"]
    steps = {}
    for tp in (1, 2):
        trainer = make_trainer(ragged + [f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}"], tmp_path / str(tp))
        try:
            steps[tp] = trainer.train_step(next(trainer.loader))
        finally:
            trainer.shutdown()
    one, group = steps[1], steps[2]
    assert group.tokens.response_lengths == one.tokens.response_lengths
    lengths, half = one.tokens.response_lengths, len(one.tokens.response_lengths) // 2
    assert one.tokens.decode_steps == max(lengths[:half]) + max(lengths[half:])
    assert group.tokens.decode_steps == max(lengths)
    for key in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "rollout_fidelity/mismatch_kl"):
        assert group.metrics[key] == pytest.approx(one.metrics[key], rel=1e-4, abs=1e-7), key
    assert_waits_fit_their_phases(group, workers=2)


def test_resume_continues_with_identical_state(local_ray, tmp_path):
    common = [
        "data.max_response_length=4",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        "trainer.save_freq=2",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
    ]
    straight = make_trainer(common, tmp_path)
    try:
        for _ in range(4):
            straight.train_step(next(straight.loader))
        expected = straight.workers.rank0("state")  # dp: rank 0 holds the whole state
    finally:
        straight.shutdown()
    resumed = make_trainer(common + ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={step_dir(tmp_path / 'ckpt', 2)}"], tmp_path)
    try:
        assert resumed.resume() == 2
        for _ in range(2):
            resumed.train_step(next(resumed.loader))
        state = resumed.workers.rank0("state")
        loader = resumed.loader.state_dict()
    finally:
        resumed.shutdown()
    saved, _ = load_checkpoint(step_dir(tmp_path / "ckpt", 4))
    assert loader == saved["trainer"]["loader"]
    for name, tensor in expected["model"].items():
        assert torch.equal(state["model"][name], tensor), f"{name} differs after resume"
    exp_opt, got_opt = expected["optimizer"]["state"], state["optimizer"]["state"]
    for key in exp_opt:
        assert torch.equal(exp_opt[key]["exp_avg"], got_opt[key]["exp_avg"])


def test_cli_runs_the_seed_style_command_and_prints_timing_keys(tmp_path):
    cmd = [
        sys.executable, "-m", "trainer",
        "algorithm.adv_estimator=grpo", "data.train_batch_size=4", "data.max_prompt_length=128",
        "data.max_response_length=4", "data.filter_overlong_prompts=True", "data.truncation='error'",
        "actor_rollout_ref.model.path=tiny", "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=300",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.temperature=0.6",
        "actor_rollout_ref.rollout.top_k=1000000", "actor_rollout_ref.rollout.top_p=1.0",
        "trainer.logger=['console']", "trainer.total_training_steps=2", "trainer.n_gpus_per_node=1", "trainer.nnodes=1",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}", "--workdir", str(tmp_path),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("step:")]
    assert len(lines) == 2
    for key in ("generate_sequences", "reshard", "gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "step"):
        assert f"timing_s/{key}:" in lines[-1]


def test_cli_rejects_an_unknown_key_naming_it(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "trainer", "data.train_batch_sise=4"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2
    assert "unknown config key 'data.train_batch_sise'; did you mean data.train_batch_size" in out.stderr


def test_the_harness_joins_a_running_ray_and_leaves_it_running(local_ray):
    with ray_session() as started:
        assert not started
    assert ray.is_initialized()
