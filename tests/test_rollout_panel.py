"""The rollout panel: --rl-rollout repeated, a second engine in every worker, and the panel's report.

Options are parsed on plain values; the worker method runs on a real Ray with the tiny preset; the
suite runs as a real pytest session (pytester subprocess) and its report is read back.
"""

from __future__ import annotations

import json

import pytest
import torch

from pytest_rlbench.options.parse import parse_options
from pytest_rlbench.options.trainer_config import build_trainer_config
from pytest_rlbench.options.values import OptionError, RawValue

pytestmark = pytest.mark.usefixtures("plugin_deps_loaded")  # see tests/conftest.py


def parse(tmp_path, value) -> object:
    return parse_options({"rl_rollout": RawValue(value, "--rl-rollout", tmp_path)}, {}, cwd=tmp_path)


# ----------------------------------------------------------------------------- the option
def test_the_first_engine_trains_and_the_others_join_the_panel(tmp_path) -> None:
    opts = parse(tmp_path, ["static", "hf"])
    assert opts.rollout == "static" and opts.rollout_panel == ("hf",)
    assert build_trainer_config(opts).actor_rollout_ref.rollout.name == "static"
    assert opts.to_dict()["rollout_panel"] == ["hf"]
    single = parse(tmp_path, "fast")  # one value, as an ini line or a plain string gives it
    assert single.rollout == "fast" and single.rollout_panel == ()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (["hf", "nope"], ["--rl-rollout='nope' is not a rollout engine", "choose one of: hf, static"]),
        (["hf", "static", "hf"], ["--rl-rollout names hf more than once", "got hf static hf"]),
    ],
)
def test_a_bad_panel_engine_is_refused_naming_the_valid_ones(tmp_path, value, expected) -> None:
    with pytest.raises(OptionError) as info:
        parse(tmp_path, value)
    assert all(part in str(info.value) for part in expected), str(info.value)


def test_a_bad_engine_name_fails_the_session_at_start_up_with_one_message(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_never_runs():\n    raise AssertionError('ran')\n")
    result = pytester.runpytest("--rl-rollout", "static", "--rl-rollout", "warp")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert err.count("--rl-rollout='warp' is not a rollout engine; choose one of: hf, static") == 1, err
    assert "ran" not in result.stdout.str()


# ----------------------------------------------------------------------------- the worker method
def test_generate_with_an_engine_of_the_session_s_kind_gives_the_session_s_tokens(tmp_path) -> None:
    from trainer.build import build_trainer, ray_session
    from trainer.config import build_config

    overrides = [
        "data.synthetic_difficulty=tiny",
        "data.train_batch_size=4",
        "data.max_response_length=8",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.name=static",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    ]
    with ray_session(num_cpus=1):
        trainer = build_trainer(build_config(overrides), tmp_path)
        try:
            prompts = next(trainer.loader)
            trainer.reshard()
            session = trainer.generate_sequences(prompts)
            panel = trainer.generate_with("static", prompts)  # a second static engine in the worker
            again = trainer.generate_with("static", prompts)  # the cached one, synced again
            other = trainer.generate_with("hf", prompts)
            old = trainer.compute_old_log_prob(other)
        finally:
            trainer.shutdown()
    for batch in (panel, again):
        assert torch.equal(batch.response_ids, session.response_ids)
        assert torch.equal(batch.response_mask, session.response_mask)
        assert torch.allclose(batch.rollout_log_probs, session.rollout_log_probs)
    assert other.response_ids.shape[0] == session.response_ids.shape[0] == 8
    mask = other.response_mask.bool()
    assert torch.allclose(old[mask], other.rollout_log_probs[mask], atol=1e-4)  # fp32 CPU: the same policy


# ----------------------------------------------------------------------------- the suite and its report
def test_the_suite_times_each_engine_on_the_same_prompts_and_the_gen_phase_stays_the_trainer_s(
    pytester: pytest.Pytester, request: pytest.FixtureRequest
) -> None:
    suites = request.config.rootpath / "suites"
    report = pytester.path / "r.json"
    result = pytester.runpytest_subprocess(
        f"{suites / 'test_phases.py'}::test_gen", str(suites / "test_rollout_panel.py"),
        "--rl-rollout", "static", "--rl-rollout", "hf", "--rl-rounds=2", "--rl-warmup-rounds=0",
        "--rl-config=data.max_response_length=8", f"--rl-report={report}", "-p", "no:randomly",
        # the repository's ini work (16 prompts x 4 responses) cut to 4 x 2: the size is not under test
        "--rl-config=data.train_batch_size=4", "--rl-config=actor_rollout_ref.rollout.n=2",
        "--rl-config=actor_rollout_ref.actor.ppo_mini_batch_size=2", timeout=300,
    )
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, out[-3000:]
    result.assert_outcomes(passed=3)  # gen, and the panel's static and hf
    data = json.loads(report.read_text())
    settings = data["run"]["config"]["settings"]
    assert settings["rollout"] == "static" and settings["rollout_panel"] == ["static", "hf"]
    assert data["phases"]["gen"]["seconds"] is not None  # the gen phase: timed by test_gen alone
    metrics = data["metrics"]
    for engine in ("static", "hf"):
        assert metrics[f"rollout_panel/{engine}/tokens_per_s"]["value"] > 0
        assert len(metrics[f"rollout_panel/{engine}/tokens_per_s"]["samples"]) == 2
        assert abs(metrics[f"rollout_panel/{engine}/token_mult_prob_error"]["value"] - 1.0) < 1e-3
        assert metrics[f"rollout_panel/{engine}/mismatch_kl"]["value"] < 1e-4
    assert not any(name.startswith("tokens_per_s") or name.startswith("timing_s") for name in metrics)
    lines = out.splitlines()
    start = lines.index("rollout engines, same prompts and seed:")
    table = lines[start + 1 : start + 4]
    assert table[0].split() == ["engine", "tokens/s", "token_mult_prob_error", "mismatch_kl"]
    assert table[1].split()[:2] == ["static", "(trains)"] and table[2].split()[0] == "hf"
    assert float(table[2].split()[2]) == pytest.approx(1.0, abs=1e-3)


def test_a_panel_engine_gets_its_own_start_up_checks() -> None:
    from pytest_rlbench.session.rollout_panel import check_panel_engine
    from trainer.config import ConfigError, build_config

    cfg = build_config(["actor_rollout_ref.rollout.tensor_model_parallel_size=2"])  # hf trains: fine
    check_panel_engine(cfg, "static")
    with pytest.raises(ConfigError, match="tensor_model_parallel_size=2 is not supported yet with rollout.name=vllm"):
        check_panel_engine(cfg, "vllm")
