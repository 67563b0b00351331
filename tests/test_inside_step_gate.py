"""A phase timed only inside the whole step, gated end to end through pytester: a session of
suites/test_step.py alone saves a baseline, and the next one, with old_log_prob made slower inside the
step, fails at the session's end on that phase, which has no gate test of its own (compare_all judges it).

The slowdown is benchmarks/gate_slow_phase.py's, the plugin the error-rate harness uses: it wraps
GRPOTrainer.compute_old_log_prob, so train_step's call, timed under VERL's key, is the slower one."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.usefixtures("plugin_deps_loaded")  # see tests/conftest.py

# The repository's ini work cut to 4 prompts x 2 responses of 8 tokens (a step of ~0.15 s on 2 cores);
# 5 rounds a side: the fewest at which the rank test can call a difference real (p = 0.004 < 0.01).
SMALL = [
    "--rl-rounds=5",
    "--rl-warmup-rounds=1",
    "--rl-config=data.max_response_length=8",
    "--rl-config=data.train_batch_size=4",
    "--rl-config=actor_rollout_ref.rollout.n=2",
    "--rl-config=actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "-p",
    "no:randomly",
]
SLOWED = "old_log_prob"


def test_a_step_only_session_fails_on_a_phase_slower_inside_the_step(
    pytester: pytest.Pytester, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = request.config.rootpath
    step_suite = str(root / "suites" / "test_step.py")
    saved, report = pytester.path / "b.json", pytester.path / "r.json"
    first = pytester.runpytest_subprocess(step_suite, *SMALL, f"--rl-save-baseline={saved}", timeout=300)
    assert first.ret == pytest.ExitCode.OK, first.stdout.str()[-3000:]
    baseline = json.loads(saved.read_text())
    assert (
        baseline["phases"][SLOWED]["inside_step"] is True and "inside_step" not in baseline["phases"]["step"]
    )

    # The step left out of the baseline (its time, and what its benchmark's gate counted and re-timed):
    # the step's own gate test then has nothing to judge, and the session can fail only by the verdicts
    # on the phases timed inside it, judged at its end.
    del baseline["phases"]["step"]
    baseline["metrics"] = {k: v for k, v in baseline["metrics"].items() if not k.endswith("/step")}
    saved.write_text(json.dumps(baseline))

    # GATE_SLOWDOWN=3: each call of the phase sleeps 3x what it took after its real work, 4x in all
    # (~0.02 s -> ~0.08 s a round, well past the 10 ms CPU floor and the 1.7x a slower host can excuse).
    monkeypatch.setenv("PYTHONPATH", str(root / "benchmarks"))
    monkeypatch.setenv("GATE_SLOW_METHOD", "compute_old_log_prob")
    monkeypatch.setenv("GATE_SLOWDOWN", "3")
    slower = pytester.runpytest_subprocess(
        step_suite,
        *SMALL,
        "-p",
        "gate_slow_phase",
        f"--rl-baseline={saved}",
        f"--rl-report={report}",
        "-v",
        timeout=300,
    )
    out = slower.stdout.str()
    assert slower.ret == pytest.ExitCode.TESTS_FAILED, out[-3000:]
    slower.assert_outcomes(passed=2)  # the step's benchmark and its gate: the failure is the session's end
    answer = next(x for x in out.splitlines() if x.startswith("FAIL  baseline 'b': "))
    assert f"{SLOWED} seconds" in answer and "step seconds" not in answer, answer
    # -v: the whole verdict under the phase's row, naming where it was timed
    lines = out.splitlines()
    row = next(i for i, x in enumerate(lines) if x.split()[:2] == ["FAIL", SLOWED])
    verdict = lines[row + 1].strip()
    assert verdict.startswith(f"{SLOWED} seconds: ") and "slower (p = " in verdict, verdict
    assert "; timed inside the step, as VERL times it" in verdict, verdict
    judged = next(
        c for c in json.loads(report.read_text())["comparisons"] if c["metric"] == f"timing_s/{SLOWED}"
    )
    assert (judged["verdict"], judged["reason"]) == ("fail", "slower") and judged["ratio"] > 2, judged
