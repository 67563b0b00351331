"""The rollout_fidelity/* figures in the plugin: recorded from the step's rounds, in the JSON report's
metrics, compared with a baseline's in the right direction, and --rl-max-mismatch."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_rlbench.options.parse import parse_options
from pytest_rlbench.options.values import OptionError, RawValue
from pytest_rlbench.records.metrics import STEP_METRICS
from pytest_rlbench.records.record import Hardware, ModelArch, RunConfig, TokenCounts
from pytest_rlbench.reports.json_report import build_report
from pytest_rlbench.session.recorder import MISMATCH_METRIC, BenchRecorder, mismatch_failure
from pytest_rlbench.verdict.compare import compare
from trainer.algorithms.fidelity import METRIC_NAMES

pytestmark = pytest.mark.usefixtures("plugin_deps_loaded")  # see tests/conftest.py

TINY = ModelArch(
    name="tiny", num_layers=1, hidden_size=2, intermediate_size=4, num_heads=1, num_kv_heads=1, head_dim=2, vocab_size=3
)


def step_rounds(error: float, pearson: float, rounds: int = 2) -> list[dict[str, float]]:
    """Whole-step rounds' StepResult.metrics, with a figure the table does not name."""
    return [{MISMATCH_METRIC: error, "rollout_fidelity/pearson": pearson, "critic/score/mean": 0.5}] * rounds


def recorded(tmp_path: Path, name: str, error: float, pearson: float):
    recorder = BenchRecorder(name, tmp_path)
    recorder.context.hardware = Hardware(
        device="cpu", nodes=1, world_size=1, gpus_per_node=0, cpu_model="x86", cpus_per_node=2
    )
    recorder.context.model = TINY
    recorder.context.config = RunConfig(
        train_batch_size=1, rollout_n=2, max_prompt_length=4, max_response_length=4
    )
    recorder.context.tokens = TokenCounts(prompt_lengths=[2, 2], response_lengths=[1, 3])
    recorder.record("step", [1.0] * 5, "t::step")
    recorder.add_step_metrics(step_rounds(error, pearson, rounds=5))  # 5 a side: the rank test can decide
    return recorder.build_record()


def test_every_fidelity_figure_has_a_direction():
    assert set(METRIC_NAMES) <= set(STEP_METRICS)
    assert STEP_METRICS["rollout_fidelity/pearson"][1] is True  # higher is better
    assert not any(higher for name, (_, higher) in STEP_METRICS.items() if not name.endswith("pearson"))


def test_step_figures_become_run_metrics_and_json_report_metrics(tmp_path):
    run = recorded(tmp_path, "run", 1.02, 0.99)
    assert set(run.metrics) == {MISMATCH_METRIC, "rollout_fidelity/pearson"}  # only the table's figures
    assert run.metrics[MISMATCH_METRIC].value == [1.02] * 5  # one sample per step round
    assert not run.metrics[MISMATCH_METRIC].higher_is_better
    report = build_report(run)
    assert report["metrics"][MISMATCH_METRIC]["value"] == pytest.approx(1.02)


def test_a_higher_mismatch_or_a_lower_pearson_than_the_baseline_fails(tmp_path):
    baseline = recorded(tmp_path, "base", 1.01, 0.99)
    worse = compare(recorded(tmp_path, "run", 1.5, 0.5), baseline, tolerance=0.1)
    verdicts = {c.metric: (c.verdict, c.reason) for c in worse.comparisons}
    assert verdicts[MISMATCH_METRIC] == ("fail", "higher")
    assert verdicts["rollout_fidelity/pearson"] == ("fail", "lower")
    better = compare(recorded(tmp_path, "run", 1.0, 1.0), baseline, tolerance=0.1)
    assert {c.metric: c.verdict for c in better.comparisons}[MISMATCH_METRIC] == "pass"


def test_max_mismatch_fails_rounds_above_the_limit():
    assert mismatch_failure(step_rounds(1.05, 1.0), None) is None
    assert mismatch_failure(step_rounds(1.05, 1.0), 1.1) is None
    assert mismatch_failure([{"critic/score/mean": 1.0}], 1.1) is None  # no figure: nothing to judge
    message = mismatch_failure(step_rounds(1.25, 1.0), 1.1)
    assert message is not None and MISMATCH_METRIC in message and "--rl-max-mismatch 1.1" in message
    assert "1.25" in message


def parse(tmp: Path, **values: str):
    raw = {dest: RawValue(v, "--" + dest.replace("_", "-"), tmp) for dest, v in values.items()}
    return parse_options(raw, {}, cwd=tmp)


def test_max_mismatch_option_is_at_least_one(tmp_path):
    assert parse(tmp_path).max_mismatch is None
    assert parse(tmp_path, rl_max_mismatch="1.1").max_mismatch == 1.1
    assert parse(tmp_path, rl_max_mismatch="1").max_mismatch == 1.0
    for bad in ("0.9", "nan", "inf", "ten"):
        with pytest.raises(OptionError, match=r"--rl-max-mismatch expects a limit F >= 1"):
            parse(tmp_path, rl_max_mismatch=bad)


STEP_SUITE = """
import pytest


class Step:  # what a round of the step benchmark returns: a StepResult has its figures in .metrics
    metrics = {{"rollout_fidelity/token_mult_prob_error": {error}, "rollout_fidelity/pearson": 0.9}}


@pytest.mark.rl_phase("step")
def test_step(rl_bench):
    rl_bench(Step)
"""


@pytest.mark.parametrize("error, passes", [(1.05, True), (1.3, False)])
def test_max_mismatch_fails_the_step_benchmark_through_pytest(pytester: pytest.Pytester, error, passes) -> None:
    pytester.makepyfile(test_suite=STEP_SUITE.format(error=error))
    result = pytester.runpytest("--rl-rounds=2", "--rl-warmup-rounds=0", "--rl-max-mismatch=1.1")
    if passes:
        result.assert_outcomes(passed=1)
    else:
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["*token_mult_prob_error 1.3 exceeds --rl-max-mismatch 1.1*"])


def test_a_fidelity_change_inside_its_noise_floor_is_no_regression(tmp_path):
    # CPU fp32 figures are rounding noise: 5 rounds all "higher" by 1e-14 must not fail the gate
    baseline = recorded(tmp_path, "base", 1.0 + 1e-14, 0.999999)
    rerun = compare(recorded(tmp_path, "run", 1.0 + 3e-14, 0.999998), baseline, tolerance=0.0)
    verdicts = {c.metric: (c.verdict, c.reason) for c in rerun.comparisons}
    assert verdicts[MISMATCH_METRIC] == ("pass", "below the noise floor")
    assert verdicts["rollout_fidelity/pearson"] == ("pass", "below the noise floor")
