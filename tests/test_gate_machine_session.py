"""The machine-relative gate end to end, through pytester: a session on a machine that ran slower as
a whole is inconclusive and passes; a phase slower than the machine fails its test.

The phases are controlled sleeps and the machine's figures are set by the session's conftest (a
calibration of a chosen length, nobody else using the CPU), so what is under test is the gate's
decision, not this shared machine's noise."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.usefixtures("plugin_deps_loaded")  # see tests/conftest.py

SUITE = """
import time
import pytest

@pytest.mark.rl_phase("update_actor")
def test_update_actor(rl_bench):
    rl_bench(lambda: time.sleep({delay}))
"""

# The machine as the session's figures see it: each calibration takes CALIBRATION_S, nothing else runs.
CONFTEST = """
from pytest_rlbench import machine_load, verdict

verdict.RELATIVE_VERDICT = True  # the machinery under test; off by default (see verdict.RELATIVE_VERDICT)
machine_load.calibration_round = lambda: {calibration}
machine_load.cores_used = lambda before, after, ticks_per_s: (0.0, 0.0)
"""


def run(pytester: pytest.Pytester, delay: float, calibration: float, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_suite=SUITE.format(delay=delay))
    pytester.makeconftest(CONFTEST.format(calibration=calibration))
    return pytester.runpytest_subprocess("--rl-rounds=5", "--rl-warmup-rounds=1", "-p", "no:randomly", *args)


def test_a_slower_machine_is_inconclusive_and_a_phase_slower_than_the_machine_fails(pytester: pytest.Pytester) -> None:
    saved, report = pytester.path / "base.json", pytester.path / "r.json"
    run(pytester, 0.05, 0.010, f"--rl-save-baseline={saved}").assert_outcomes(passed=1)
    metrics = json.loads(saved.read_text())["metrics"]
    assert metrics["machine/calibration_s/update_actor"]["value"] == [0.010] * 5
    assert metrics["machine/other_cores/update_actor"]["value"] == 0.0  # one value is stored as a number

    # the phase 1.5x slower in seconds, the machine 1.5x slower too: not a regression this session can tell
    slower_machine = run(pytester, 0.075, 0.015, f"--rl-baseline={saved}", f"--rl-report={report}")
    assert slower_machine.ret == pytest.ExitCode.OK, slower_machine.stdout.str()
    row = next(c for c in json.loads(report.read_text())["comparisons"] if c["metric"] == "timing_s/update_actor")
    assert (row["verdict"], row["reason"]) == ("inconclusive", "machine slower")
    assert "the machine itself ran 1.50x slower than in the baseline's session" in row["message"]

    # the phase 1.5x slower on an unchanged machine: a regression, the phase's test fails
    slower_phase = run(pytester, 0.075, 0.010, f"--rl-baseline={saved}")
    slower_phase.assert_outcomes(failed=1)
    assert "relative to the machine's speed ratio 1.5" in slower_phase.stdout.str()


# The session's own workers busy during every calibration (what a change that keeps worker threads busy
# between rounds does): the calibration no longer measures the machine alone.
BUSY_CONFTEST = CONFTEST + """
machine_load.busy_seconds = lambda before, after, skip=(): 1.0
"""


def test_a_session_busy_during_its_calibrations_is_judged_in_plain_seconds(pytester: pytest.Pytester) -> None:
    saved = pytester.path / "base.json"
    run(pytester, 0.05, 0.010, f"--rl-save-baseline={saved}").assert_outcomes(passed=1)
    assert json.loads(saved.read_text())["metrics"]["machine/own_cores/update_actor"]["value"] < 0.25
    # the phase and the calibration both 1.5x slower, but the session was busy while it calibrated
    pytester.makeconftest(BUSY_CONFTEST.format(calibration=0.015))
    pytester.makepyfile(test_suite=SUITE.format(delay=0.075))
    busy = pytester.runpytest_subprocess("--rl-rounds=5", "--rl-warmup-rounds=1", "-p", "no:randomly",
                                         f"--rl-baseline={saved}")
    busy.assert_outcomes(failed=1)
    out = busy.stdout.str()
    assert "during the calibrations (from 0.25): judged in plain seconds" in out
    assert "tolerance 0.20, the default in plain seconds" in out


# Each calibration leaves a line in calibrations.txt: how many a session ran.
COUNTING_CONFTEST = """
from pytest_rlbench import machine_load

def calibration_round():
    with open("calibrations.txt", "a") as fh:
        fh.write("x\\n")
    return 0.010

machine_load.calibration_round = calibration_round
"""


def test_the_machine_is_calibrated_before_each_timed_round_only(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE.format(delay=0.01))
    pytester.makeconftest(COUNTING_CONFTEST)
    pytester.runpytest_subprocess("--rl-rounds=5", "--rl-warmup-rounds=2").assert_outcomes(passed=1)
    assert (pytester.path / "calibrations.txt").read_text().count("x") == 5  # none before warm-up rounds
