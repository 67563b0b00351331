"""CPU contention in the gate end to end, through pytester: a session records the cores used beside each
phase's rounds; a session that slowed as a whole is inconclusive against its pace, but the same session
beside CPU contention fails its gates in plain seconds, naming the contention.

The phases are controlled sleeps and, where said, the cores beside the session are set for the session
(machine_load.cores_used replaced while it runs), so what is under test is the gate's decision, not this
shared machine's noise. The sessions run in-process: no Ray, and a subprocess's imports cost seconds."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.usefixtures("plugin_deps_loaded")  # see tests/conftest.py

# Three phases apart from one another: each is paced by the other two (pytest_rlbench.verdict.session_pace).
SUITE = """
import time
import pytest

@pytest.mark.rl_phase("old_log_prob")
def test_old_log_prob(rl_bench):
    rl_bench(lambda: time.sleep({delay}))

@pytest.mark.rl_phase("ref")
def test_ref(rl_bench):
    rl_bench(lambda: time.sleep({delay}))

@pytest.mark.rl_phase("update_actor")
def test_update_actor(rl_bench):
    rl_bench(lambda: time.sleep({delay}))
"""


def run(
    pytester: pytest.Pytester, delay: float, *args: str, cores: tuple[float, float] | None = (0.0, 0.0)
) -> pytest.RunResult:
    """A session of SUITE; ``cores``: the CPU beside its rounds as /proc would show it (other processes,
    the hypervisor), None: /proc as it is."""
    from pytest_rlbench.verdict import machine_load

    pytester.makepyfile(test_suite=SUITE.format(delay=delay))
    with pytest.MonkeyPatch.context() as patch:
        if cores is not None:
            patch.setattr(machine_load, "cores_used", lambda before, after, ticks_per_s: cores)
        return pytester.runpytest("--rl-rounds=5", "--rl-warmup-rounds=1", "-p", "no:randomly", *args)


def test_a_session_records_the_cores_used_beside_each_phases_rounds(pytester: pytest.Pytester) -> None:
    saved = pytester.path / "base.json"
    run(pytester, 0.01, f"--rl-save-baseline={saved}", cores=None).assert_outcomes(passed=6)  # /proc as it is
    metrics = json.loads(saved.read_text())["metrics"]
    for phase in ("old_log_prob", "ref", "update_actor"):
        for figure in ("other_cores", "steal_cores"):
            value = metrics[f"machine/{figure}/{phase}"]["value"]  # one value is stored as a number
            assert isinstance(value, float) and 0 <= value < 64
    assert {m.split("/")[1] for m in metrics if m.startswith("machine/")} == {"other_cores", "steal_cores"}


def test_contention_keeps_plain_seconds_deciding_where_the_sessions_pace_would_excuse(
    pytester: pytest.Pytester,
) -> None:
    saved, report = pytester.path / "base.json", pytester.path / "r.json"
    run(pytester, 0.06, f"--rl-save-baseline={saved}").assert_outcomes(passed=6)  # and the gates that re-time

    # every phase 1.5x slower, nobody else on the CPU: the session ran slower, which is no regression
    slower = run(pytester, 0.09, f"--rl-baseline={saved}", f"--rl-report={report}")
    assert slower.ret == pytest.ExitCode.OK, slower.stdout.str()
    slower.assert_outcomes(passed=6)  # three benchmarks and their gates
    row = next(
        c for c in json.loads(report.read_text())["comparisons"] if c["metric"] == "timing_s/update_actor"
    )
    assert (row["verdict"], row["reason"]) == ("inconclusive", "session slower")

    # the same slowdown beside CPU contention: plain seconds stand, and each gate names the contention
    contended = run(pytester, 0.09, f"--rl-baseline={saved}", f"--rl-report={report}", cores=(1.7, 0.05))
    contended.assert_outcomes(passed=3, failed=3)
    out = contended.stdout.str()
    assert "other processes used 1.70 cores, the hypervisor took 0.05 cores: CPU contention" in out
    assert "tolerance 0.15, the default" in out
    row = next(
        c for c in json.loads(report.read_text())["comparisons"] if c["metric"] == "timing_s/update_actor"
    )
    assert (row["verdict"], row["reason"]) == ("fail", "slower")
    assert "session's other phases" not in row["message"]


def test_the_cpu_beside_the_rounds_is_watched_wherever_the_sessions_processes_are_this_machines() -> None:
    from types import SimpleNamespace

    from pytest_rlbench.session.bench import watches_machine

    # GPU sessions too: four sharing one host's CPUs failed unchanged code on reward, naming nothing
    assert watches_machine(SimpleNamespace(embedded=True, gpu=True))
    assert watches_machine(SimpleNamespace(embedded=True, gpu=False))
    assert not watches_machine(SimpleNamespace(embedded=False, gpu=False))  # an external cluster's processes are not known
