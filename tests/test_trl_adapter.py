"""--rl-trainer trl: TRL's GRPOTrainer on the session's model, data, reward and batch, timed per phase.

The mapping of the config onto TRL's settings is pure and tested without TRL; the adapter and a whole
session run TRL for real on CPU with the tiny preset (skipped only where TRL is not installed).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_rlbench.frameworks import OURS_LABEL
from pytest_rlbench.frameworks.trl_settings import batch_plan, trl_plan
from pytest_rlbench.option_values import OptionError, RawValue
from pytest_rlbench.options import parse_options
from pytest_rlbench.record import Provenance, record_from_dict
from pytest_rlbench.report_terminal import framework_lines
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

    assert parse_options({}, {}, cwd=tmp_path).trainer == "ours"
    assert parse("ours").trainer == parse("ours", "ours").trainer == "ours"
    with pytest.raises(OptionError, match=r"--rl-trainer='verl' is not a framework.*ours, trl"):
        parse("verl")
    with pytest.raises(OptionError, match="ours and trl in one session is not supported yet"):
        parse("ours", "trl")


def test_the_bundled_trainer_s_report_has_no_framework_lines() -> None:
    class Run:
        provenance = Provenance(source="run", framework=OURS_LABEL)

    assert framework_lines(None) == [] and framework_lines(Run()) == []


# ----------------------------------------------------------------------------- TRL for real
trl = pytest.importorskip("trl", reason="TRL is not installed (pip install 'pytest-rlbench[trl]')")


def test_trl_refuses_more_than_one_worker_rather_than_misreport_per_gpu_figures(tmp_path: Path) -> None:
    from pytest_rlbench.frameworks.trl_adapter import TRLAdapter

    cfg = build_config([*SMALL, "trainer.n_gpus_per_node=2"], check_names=False)
    with pytest.raises(ValueError, match="runs one process, found 2 workers"):
        TRLAdapter(cfg, None, tmp_path)


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory):
    from pytest_rlbench.frameworks.trl_adapter import TRLAdapter
    from trainer.data.source import load_train_dataset, write_synthetic_set
    from trainer.models.presets import load_tokenizer

    workdir = tmp_path_factory.mktemp("trl")
    data = workdir / "synthetic.parquet"
    cfg = build_config([f"data.train_files=['{data}']", *SMALL])
    tokenizer = load_tokenizer("tiny")
    write_synthetic_set(cfg.data, data, tokenizer)
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
    assert adapter.update_actor(batch)["actor/grad_norm"] >= 0
    assert adapter.trl.state.global_step == 4
    assert set(adapter.absent_phases) == {"reshard", "generate_sequences", "adv", "save_checkpoint"}
    assert all(r.startswith(f"trl does not separate {k}") for k, r in adapter.absent_phases.items())


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


def test_a_session_with_rl_trainer_trl_records_its_framework_and_skips_what_trl_lacks(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_trl_session=SESSION_TESTS)
    overrides = [arg for o in SMALL for arg in ("--rl-config", o)]
    result = pytester.runpytest_subprocess(
        "--rl-trainer", "trl", "--rl-rounds", "1", "--rl-warmup-rounds", "0", "-rs",
        "--rl-save-baseline", "trl.json", *overrides, timeout=240,
    )
    result.assert_outcomes(passed=1, skipped=1)
    # the summary names the framework first, the skip reasons come last
    result.stdout.fnmatch_lines([f"framework: trl {trl.__version__}, settings*", "*trl does not separate adv*"])
    saved = record_from_dict(json.loads((pytester.path / "trl.json").read_text()))  # loads back as a baseline
    assert saved.provenance.framework == f"trl {trl.__version__}"
    assert any("dual-clip" in line for line in saved.provenance.differences)
    assert framework_lines(saved)[1:] == [f"  - {line}" for line in saved.provenance.differences]
