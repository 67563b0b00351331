"""--rl-trainer trl: TRL's GRPOTrainer on the session's model, data, reward and batch, timed per phase.

The mapping of the config onto TRL's settings, the rule of which phases a trainer skips and the rule
that a saved run of the other framework is no gate are pure and tested without TRL; the adapter and a
whole session of both frameworks run TRL for real on CPU with the tiny preset (skipped only where TRL
is not installed).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pytest_rlbench.frameworks import OURS_LABEL, framework_mismatch
from pytest_rlbench.frameworks.phase_skips import NO_REF, absent_phases
from pytest_rlbench.frameworks.trl_settings import batch_plan, trl_plan
from pytest_rlbench.options.parse import parse_options
from pytest_rlbench.options.values import OptionError, RawValue
from pytest_rlbench.records.record import Provenance, record_from_dict
from pytest_rlbench.reports.terminal import framework_lines
from pytest_rlbench.verdict.compare import compare
from trainer.config import build_config

SMALL = [
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "data.max_response_length=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.rollout.ignore_eos=True",
    "actor_rollout_ref.actor.optim.lr=0.01",
    "data.synthetic_size=16",
]


# ----------------------------------------------------------------------------- settings, pure
def test_one_step_of_ours_is_the_same_micro_batches_and_optimizer_steps_in_trl() -> None:
    # 16 prompts x 4 responses, mini-batches of 8 prompts, micro-batches of 4 responses.
    assert batch_plan(64, 32, 4) == (4, 8, 16)
    assert batch_plan(64, 32, 12) == (4, 8, 16)  # 12 does not divide 32: the largest that divides both
    with pytest.raises(ValueError, match="mini-batches of 24"):
        batch_plan(64, 24, 4)


def test_the_config_maps_onto_trl_keys() -> None:
    cfg = build_config(SMALL, check_names=False)
    plan = trl_plan(cfg, "/out", "float32")
    a = plan.args
    assert (a["per_device_train_batch_size"], a["gradient_accumulation_steps"], a["steps_per_generation"]) == (2, 2, 4)
    assert (a["num_generations"], a["max_completion_length"], a["beta"], a["learning_rate"]) == (2, 8, 0.001, 0.01)
    assert a["generation_kwargs"] == {"min_new_tokens": 8}  # ignore_eos: every response full length
    assert (a["loss_type"], a["scale_rewards"], a["epsilon"], a["use_cpu"], a["bf16"]) == (
        "dapo", "group", 0.2, True, False
    )
    assert plan.computes_old_log_prob  # two optimizer steps per generation: TRL computes them


def test_without_kl_loss_beta_is_0_and_one_optimizer_step_needs_no_old_log_probs() -> None:
    cfg = build_config(
        [*SMALL, "actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
         "actor_rollout_ref.rollout.ignore_eos=False"],
        check_names=False,
    )
    plan = trl_plan(cfg, "/out", "float32")
    assert plan.args["beta"] == 0.0 and "generation_kwargs" not in plan.args
    assert not plan.computes_old_log_prob


def test_settings_trl_cannot_take_are_listed() -> None:
    cfg = build_config(
        [*SMALL, "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum", "algorithm.use_kl_in_reward=True",
         "actor_rollout_ref.actor.kl_loss_type=k1"],
        check_names=False,
    )
    text = "\n".join(trl_plan(cfg, "/out", "float32").differences)
    for expected in ("seq-mean-token-sum", "use_kl_in_reward", "kl_loss_type k1", "dual-clip", "driver process"):
        assert expected in text


def test_rl_trainer_accepts_ours_and_trl_and_names_the_choices_otherwise(tmp_path: Path) -> None:
    def parse(*given: str):
        return parse_options({"rl_trainer": RawValue(list(given), "--rl-trainer", tmp_path)}, {}, cwd=tmp_path)

    assert parse_options({}, {}, cwd=tmp_path).trainers == ("ours",)
    assert parse("ours").trainers == parse("ours", "ours").trainers == ("ours",)
    with pytest.raises(OptionError, match=r"--rl-trainer='verl' is not a framework.*ours, trl"):
        parse("verl")
    both = parse("trl", "ours", "trl")  # several in one session, in the order given
    assert both.trainers == ("trl", "ours") and both.trainer == "trl"


def test_a_saved_run_of_the_other_framework_is_never_a_gate_but_a_published_target_still_can_be() -> None:
    assert framework_mismatch(OURS_LABEL, "trl 1.16.0") == ["framework: run 'pytest-rlbench', baseline 'trl 1.16.0'"]
    assert framework_mismatch("trl 1.17.0", "trl 1.16.0") == []  # an upgrade is what a gate catches
    assert framework_mismatch("trl 1.16.0", "verl") == framework_mismatch(OURS_LABEL, None) == []


def test_one_rule_names_the_phases_a_trainer_cannot_time() -> None:
    @dataclasses.dataclass
    class Trainer:  # the interface the rule reads: uses_ref, and a framework's absent_phases
        uses_ref: bool
        absent_phases: dict[str, str] = dataclasses.field(default_factory=dict)

    assert absent_phases(Trainer(True)) == {}
    assert absent_phases(Trainer(False)) == {"ref": NO_REF}
    assert absent_phases(Trainer(False, {"adv": "inline"})) == {"ref": NO_REF, "adv": "inline"}


def test_the_bundled_trainer_s_report_has_no_framework_lines() -> None:
    class Run:
        provenance = Provenance(source="run", framework=OURS_LABEL)

    assert framework_lines(None) == [] and framework_lines(Run()) == []


# ----------------------------------------------------------------------------- TRL for real
trl = pytest.importorskip("trl", reason="TRL is not installed (pip install 'pytest-rlbench[trl]')")
torch = pytest.importorskip("torch")


def test_trl_refuses_more_than_one_worker_rather_than_misreport_per_gpu_figures(tmp_path: Path) -> None:
    from pytest_rlbench.frameworks.trl_adapter import TRLAdapter

    cfg = build_config([*SMALL, "trainer.n_gpus_per_node=2"], check_names=False)
    with pytest.raises(ValueError, match="runs one process, found 2 workers"):
        TRLAdapter(cfg, None, tmp_path)


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory):
    """The adapter on two train files of different questions (a multi-file data set)."""
    from pytest_rlbench.frameworks.trl_adapter import TRLAdapter
    from trainer.data.source import load_train_dataset, write_synthetic_set
    from trainer.models.presets import load_tokenizer

    workdir = tmp_path_factory.mktemp("trl")
    files = [workdir / "first.parquet", workdir / "second.parquet"]
    cfg = build_config([f"data.train_files={[str(f) for f in files]}", *SMALL])
    tokenizer = load_tokenizer("tiny")
    for seed, path in enumerate(files, start=1):
        write_synthetic_set(dataclasses.replace(cfg.data, seed=seed), path, tokenizer)
    return TRLAdapter(cfg, load_train_dataset(cfg.data, tokenizer, workdir), workdir)


@pytest.fixture(scope="module")
def step(adapter):
    prompts = next(adapter.loader)
    before = {k: v.clone() for k, v in adapter.trl.model.state_dict().items()}
    return prompts, adapter.train_step(prompts), before


def test_a_step_is_trl_s_own_with_its_phases_timed_under_verl_keys(adapter, step) -> None:
    prompts, result, before = step
    timing = result.timing_s
    assert set(timing) == {"gen", "reward", "old_log_prob", "ref", "update_actor", "step"}
    assert sum(v for k, v in timing.items() if k != "step") <= timing["step"]
    assert adapter.trl.state.global_step == 2  # two mini-batches: two optimizer steps, as ours
    after = adapter.trl.model.state_dict()
    assert any(not after[k].equal(v) for k, v in before.items())
    assert adapter.framework == f"trl {trl.__version__}"


def test_trl_gets_our_prompts_through_the_same_chat_template(adapter, step) -> None:
    prompts, result, _ = step
    n = adapter.cfg.actor_rollout_ref.rollout.n
    ours = [list(p.input_ids) for p in prompts.prompts for _ in range(n)]
    assert adapter.last_batch.prompt_ids == ours
    assert result.tokens.prompt_lengths == [len(ids) for ids in ours]


def test_every_prompt_of_a_multi_file_data_set_is_its_own_conversation_in_trl(adapter) -> None:
    # The second file's rows restart at 0: a lookup by row in the first file gave them its questions.
    prompts = adapter.dataset.prompts
    assert {p.uid.split(":")[0] for p in prompts} == {"0", "1"}
    from trainer.data.chat_template import template_prompts

    rows = [adapter._row(p) for p in prompts]
    assert template_prompts(rows, adapter.tokenizer) == [list(p.input_ids) for p in prompts]


def test_ignore_eos_gives_full_length_responses_and_the_reward_is_ours(adapter, step) -> None:
    from trainer.driver.reward import score_batch

    batch = adapter.last_batch
    assert batch.size == 8 and set(step[1].tokens.response_lengths) == {8}
    scored = adapter.compute_reward(batch)
    texts = adapter.tokenizer.batch_decode(batch.completion_ids, skip_special_tokens=True)
    expected = score_batch(texts, [row["ground_truth"] for row in batch.inputs])
    assert scored.token_level_scores.sum(dim=1).tolist() == expected


def test_the_phase_replays_call_trl_on_the_step_s_batch(adapter, step) -> None:
    batch = adapter.last_batch
    assert adapter.compute_ref_log_prob(batch).shape == batch.response_ids.shape
    assert adapter.compute_old_log_prob(batch).shape == batch.response_ids.shape
    optimizer_steps = adapter.trl.state.global_step
    assert adapter.update_actor(batch)["actor/grad_norm"] >= 0
    assert adapter.trl.state.global_step == optimizer_steps + 2  # the step's two mini-batches again
    assert set(adapter.absent_phases) == {"reshard", "generate_sequences", "adv", "save_checkpoint"}
    assert all(r.startswith(f"trl does not separate {k}") for k, r in adapter.absent_phases.items())


def test_the_step_s_score_mean_is_trl_s_weighted_reward(adapter) -> None:
    # TRL sums each reward function's column times its reward_weights entry (_generate_and_score_completions);
    # the step's critic/score/mean is that sum's mean, as trl logs "reward".
    def always_one(completions, **_):
        return [1.0] * len(completions)

    funcs, weights = adapter.trl.reward_funcs, adapter.trl.reward_weights
    adapter.trl.reward_funcs, adapter.trl.reward_weights = [always_one], torch.tensor([2.5])
    try:
        result = adapter.train_step(next(adapter.loader))
        assert result.metrics["critic/score/mean"] == 2.5
        assert adapter.compute_reward(adapter.last_batch).token_level_scores.sum(dim=1).tolist() == [2.5] * 8
    finally:
        adapter.trl.reward_funcs, adapter.trl.reward_weights = funcs, weights


SESSION_TESTS = """
import pytest

@pytest.mark.rl_phase("step")
def test_step(rl_trainer, rl_bench):
    rl_bench(lambda: rl_trainer.train_step(next(rl_trainer.loader)), tokens=lambda r: r.tokens,
             breakdown=lambda r: r.timing_s)

@pytest.mark.rl_phase("adv")
def test_adv(rl_trainer, rl_batch, rl_bench):
    rl_bench(lambda: rl_trainer.compute_advantage(rl_batch.batch))
"""


def test_one_session_runs_both_frameworks_side_by_side_with_trl_s_absent_phases_absent_for_trl_only(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_both=SESSION_TESTS)
    overrides = [arg for o in SMALL for arg in ("--rl-config", o)]
    result = pytester.runpytest_subprocess(
        "--rl-trainer", "ours", "--rl-trainer", "trl", "--rl-rounds", "1", "--rl-warmup-rounds", "0", "-rs", "-v",
        "--rl-save-baseline", "base.json", "--rl-report", "report.json", *overrides, timeout=480,
    )
    # each framework's benchmarks, then their gates (which on CPU time each phase again for the saved
    # baseline) before the next framework's trainer is built; trl's adv gate is skipped with its benchmark
    result.assert_outcomes(passed=6, skipped=2)
    label = f"trl {trl.__version__}"
    result.stdout.fnmatch_lines([
        "*test_step[[]ours[]] PASSED*", "*test_adv[[]ours-gate[]] PASSED*", "*test_step[[]trl[]] PASSED*",
        "*test_adv[[]trl[]] SKIPPED*", "*test_step[[]trl-gate[]] PASSED*",
    ])
    result.stdout.fnmatch_lines([
        "frameworks side by side*",
        f"*phase*figure*{OURS_LABEL}*{label}*",
        "*adv*time*s*absent*",  # ours timed it, trl does not separate it
        "*step*time*s*s*",
        f"{OURS_LABEL} (record 'base'):*",
        f"{label} (record 'base-trl'):*",
        "*settings not made equal:*",
        "*trl does not separate adv*",  # the skip reason, last
    ])
    report = json.loads((pytester.path / "report.json").read_text())
    ours, theirs = report["frameworks"]["ours"]["phases"], report["frameworks"]["trl"]["phases"]
    assert report["phases"] == ours and report["passed"]
    assert ours["adv"]["seconds"] and ours["step"]["seconds"] and theirs["step"]["seconds"]
    assert not any("absent" in phase for phase in ours.values())
    absent = {key for key, phase in theirs.items() if "absent" in phase}
    assert absent == {"reshard", "generate_sequences", "adv", "save_checkpoint"}
    assert theirs["adv"]["seconds"] is None and theirs["adv"]["absent"].startswith("trl does not separate adv")
    # each framework's record saved on its own, naming its framework; one gates only its own framework
    ours_saved = record_from_dict(json.loads((pytester.path / "base.json").read_text()))
    trl_saved = record_from_dict(json.loads((pytester.path / "base-trl.json").read_text()))
    assert (ours_saved.provenance.framework, trl_saved.provenance.framework) == (OURS_LABEL, label)
    assert framework_lines(trl_saved)[1:] == [f"  - {line}" for line in trl_saved.provenance.differences]
    assert compare(trl_saved, trl_saved).mode == "gate"
    across = compare(trl_saved, ours_saved)
    assert across.mode == "reference" and f"framework: run {label!r}, baseline {OURS_LABEL!r}" in across.mismatches
