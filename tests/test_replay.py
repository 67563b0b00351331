"""--rl-workload end to end, through pytester: a baseline saved by one session is replayed by the next
with no other --rl-config, does exactly the recorded work and is gated; work changed on top of a
replay turns the comparison into a reference and says why."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("plugin_deps_loaded")  # see tests/conftest.py

SUITE = """
import pytest

@pytest.mark.rl_phase("old_log_prob")
def test_old_log_prob(rl_trainer, rl_batch, rl_bench):
    rl_bench(lambda: rl_trainer.compute_old_log_prob(rl_batch.batch), tokens=rl_batch.tokens)
"""
# The saved run's work: every key here differs from the trainer's default, so a replay that left any
# of them out would show in the run configuration. (The data set is not work: a replay uses its own.)
SAVED_WORK = [
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "data.max_response_length=8",
    "actor_rollout_ref.rollout.target_lengths.distribution=lognormal",
    "actor_rollout_ref.rollout.target_lengths.mean=5",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.rollout.temperature=0.7",
]


def session(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """A whole session in a subprocess: it starts Ray and the trainer's workers."""
    pytester.makepyfile(test_suite=SUITE)
    return pytester.runpytest_subprocess("--rl-rounds=2", "--rl-warmup-rounds=0", *args, timeout=300)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pytest.RunResult]:
    """The baseline of the saved work, saved once for the module's replays (each session starts Ray and
    the workers: a minute's work on a small machine), and the session that saved it."""
    directory = tmp_path_factory.mktemp("saved")
    (directory / "test_suite.py").write_text(SUITE)
    path = directory / "saved.json"
    args = ["--rl-rounds=2", "--rl-warmup-rounds=0", f"--rl-save-baseline={path}"]
    args += [f"--rl-config={o}" for o in SAVED_WORK]
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--basetemp={directory / 'tmp'}", *args],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=300,
    )
    result = pytest.RunResult(
        done.returncode, done.stdout.splitlines(), done.stderr.splitlines(), time.monotonic() - start
    )
    return path, result


def comparisons_with(report: dict, name: str) -> list[dict]:
    return [c for c in report["comparisons"] if c["source"] == name]


def test_a_saved_baseline_replayed_does_the_recorded_work_is_a_gate_and_replaces_the_ini_file_s_work(
    pytester: pytest.Pytester, saved: tuple[Path, pytest.RunResult]
) -> None:
    # One replay session asserts both: it does exactly the recorded work, as a gate, and that work
    # replaces the ini file's default work (like this repository's pyproject.toml). The ini sets only
    # three of SAVED_WORK's keys: the others still show the replay overriding the trainer's defaults.
    saved, first = saved
    first.assert_outcomes(passed=2)  # the benchmark, and its gate timing the phase again for the baseline
    baseline = json.loads(saved.read_text())
    assert baseline["workload"]["response_length"]["shape"]["value"] == "lognormal"

    pytester.makeini(
        """
        [pytest]
        rl_config =
            data.train_batch_size=8
            actor_rollout_ref.actor.ppo_mini_batch_size=4
            data.max_response_length=16
        """
    )
    report_path = pytester.path / "replay.json"
    replay = session(pytester, f"--rl-workload={saved}", f"--rl-report={report_path}", "--rl-tolerance=0.9")
    # the benchmark passes and its gate runs; the gate's verdict is this machine's timing (a 0.025 s phase
    # ran 4x slower once beside other test processes), not this test's subject: the work and the mode are
    outcomes = replay.parseoutcomes()
    assert outcomes.get("passed", 0) >= 1 and outcomes.get("passed", 0) + outcomes.get("failed", 0) == 2, outcomes
    assert "errors" not in outcomes and "error" not in outcomes, outcomes
    report = json.loads(report_path.read_text())
    assert report["run"]["config"] == baseline["config"]  # the same work key for key, not the ini file's
    assert report["run"]["workload"] == baseline["workload"]
    assert report["run"]["model"] == baseline["model"]
    gated = comparisons_with(report, "saved")
    assert gated and {c["mode"] for c in gated} == {"gate"}
    assert "replaying the work per GPU of baseline 'saved' on 1 worker(s)" in replay.stdout.str()


def test_work_changed_on_top_of_a_replay_makes_it_a_reference_and_says_why(
    pytester: pytest.Pytester, saved: tuple[Path, pytest.RunResult]
) -> None:
    saved, first = saved
    first.assert_outcomes(passed=2)
    report_path = pytester.path / "replay.json"
    replay = session(
        pytester,
        f"--rl-workload={saved}",
        "--rl-config=actor_rollout_ref.rollout.n=4",
        f"--rl-report={report_path}",
    )
    replay.assert_outcomes(passed=1, skipped=1)  # the gate: no baseline gates the phase
    out = replay.stdout.str()
    assert (
        "actor_rollout_ref.rollout.n=4 (from --rl-config actor_rollout_ref.rollout.n=4) instead of the replay's 2"
        in out
    )
    report = json.loads(report_path.read_text())
    assert {c["mode"] for c in comparisons_with(report, "saved")} == {"reference"}


def test_a_workload_that_cannot_be_replayed_is_a_usage_error(pytester: pytest.Pytester) -> None:
    record = pytester.path / "no_workload.json"
    # a stored baseline file with its workload section removed: an older file
    from pytest_rlbench.records.baselines import resolve_baseline

    data = json.loads(resolve_baseline("verl-v0.5.0-1.5b").read_text())
    data.pop("workload")
    record.write_text(json.dumps(data))
    result = session(pytester, f"--rl-workload={record}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--rl-workload*records no workload, so its work cannot be replayed*"])


def test_a_length_shape_set_on_top_of_a_replay_keeps_the_workload_s_other_values(
    pytester: pytest.Pytester, saved: tuple[Path, pytest.RunResult]
) -> None:
    # The uniform-at-the-mean check of the length shape's weight: only the shape changes.
    saved, first = saved
    first.assert_outcomes(passed=2)
    pytester.makeini("[pytest]\nrl_config =\n    data.max_response_length=4\n")
    replay = session(
        pytester,
        f"--rl-workload={saved}",
        "--rl-config=actor_rollout_ref.rollout.target_lengths.distribution=constant",
    )
    replay.assert_outcomes(passed=2)  # the benchmark and its gate
    assert "target_lengths.distribution='constant' (from --rl-config" in replay.stdout.str()
