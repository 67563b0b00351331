"""CPU contention beside a session: where either session ran beside it the plain seconds decide (the
session's pace is not applied) and a failure names it; the machine's figures are never judged
themselves; and the figures' own plumbing (CPU use from /proc)."""

from __future__ import annotations

import dataclasses
import os
import resource
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from test_compare import record
from test_session_pace import session

from pytest_rlbench.records.record import Metric, RunRecord
from pytest_rlbench.verdict import machine_load
from pytest_rlbench.verdict.compare import compare, machine_evidence, phase_comparisons
from pytest_rlbench.verdict.judge import CONTENTION_CORES, MachineEvidence
from pytest_rlbench.verdict.machine_load import CpuSnapshot, cores_used, descendants_ticks, machine_metric
from pytest_rlbench.verdict.noise import default_tolerance

CPU = {"device": "cpu", "gpus_per_node": None, "gpu_model": None, "cpu_model": "AMD EPYC", "cpus_per_node": 2}
BASE_ROUNDS = [1.0, 1.01, 1.02, 1.03, 1.04]


def metric(values: list[float], unit: str = "s") -> dict[str, Any]:
    return {"value": values, "unit": unit, "higher_is_better": False}


def cpu_record(
    name: str, seconds: list[float], other: float | None = 0.0, steal: float = 0.0, **changes: Any
) -> Any:
    """A CPU session that timed update_actor (beside the shared record's gen and step: too few peers for
    a pace), with the cores other processes used and the hypervisor took beside it (``other`` None:
    no machine figures, as an external Ray records none)."""
    metrics = {}
    if other is not None:
        metrics[machine_metric("other_cores", "update_actor")] = metric([other], "cores")
        metrics[machine_metric("steal_cores", "update_actor")] = metric([steal], "cores")
    return record(name, hardware=CPU, phases={"update_actor": {"seconds": seconds}}, metrics=metrics, **changes)


def row(
    run_seconds: list[float], other: float | None = 0.0, base_other: float | None = 0.0, tolerance: float = 0.15,
    steal: float = 0.0, **base_changes: Any,
) -> Any:
    base = cpu_record("local-ci", BASE_ROUNDS, base_other, **base_changes)
    result = compare(cpu_record("run", run_seconds, other, steal), base, tolerance)
    assert result.mode == "gate"
    return {c.metric: c for c in result.comparisons}["timing_s/update_actor"]


SLOWER = [1.4, 1.41, 1.42, 1.43, 1.44]  # every round 1.4x the baseline's


def test_contention_beside_the_session_fails_in_plain_seconds_and_is_named() -> None:
    verdict = row(SLOWER, other=1.7, steal=0.05)
    assert (verdict.verdict, verdict.reason) == ("fail", "slower")
    assert "; other processes used 1.70 cores, the hypervisor took 0.05 cores: CPU contention" in verdict.message
    assert CONTENTION_CORES < 1.7
    # contention without a slower phase passes
    assert row(BASE_ROUNDS, other=1.7).verdict == "pass"
    # below the threshold it is no contention: the failure lists the figures, without the claim
    quiet = row(SLOWER, other=0.1)
    assert quiet.verdict == "fail" and "beside the rounds other processes used 0.10 cores" in quiet.message
    assert "CPU contention" not in quiet.message


def test_a_baseline_saved_under_contention_leaves_plain_seconds_to_decide_and_is_named() -> None:
    # the baseline's rounds slowed by contention beside its session: the unchanged run passes
    base = cpu_record("local-ci", [t * 1.4 for t in BASE_ROUNDS], other=1.2)
    result = compare(cpu_record("run", BASE_ROUNDS), base, 0.15)
    assert result.passed and not result.inconclusive
    # a slower run against it fails, naming the baseline's contention
    slower = row(SLOWER, base_other=1.2)
    assert slower.verdict == "fail"
    assert "other processes used 0.00 cores (and 1.20 cores beside the baseline's own session): CPU contention" in (
        slower.message
    )
    # the run recorded nothing (an external Ray): the baseline's contention is still named
    assert "other processes used 1.20 cores beside the baseline's own session: CPU contention" in row(
        SLOWER, other=None, base_other=1.2
    ).message


def with_cores(run: RunRecord, other: float) -> RunRecord:
    """``run`` with ``other`` cores used beside each of its phases' rounds."""
    figures = {machine_metric("other_cores", p): Metric([other], "cores", False) for p in run.phases}
    return dataclasses.replace(run, metrics={**run.metrics, **figures})


def test_under_contention_the_sessions_pace_is_not_applied() -> None:
    # every phase 1.4x slower: alike, so against the session's pace the phases are inconclusive ...
    run, base = session("run", everything=1.4), session("base")
    quiet = {c.phase: c for c in compare(with_cores(run, 0.0), with_cores(base, 0.0), 0.20).comparisons}
    assert (quiet["update_actor"].verdict, quiet["update_actor"].reason) == ("inconclusive", "session slower")
    # ... but under contention in the run, or in the baseline's session, plain seconds decide
    for contended in (compare(with_cores(run, 1.7), with_cores(base, 0.0), 0.20),
                      compare(with_cores(run, 0.0), with_cores(base, 1.7), 0.20)):
        update = next(c for c in contended.comparisons if c.metric == "timing_s/update_actor")
        assert (update.verdict, update.reason) == ("fail", "slower")
        assert "1.70 cores" in update.message and ": CPU contention" in update.message
        assert "session's pace" not in update.message and "other phases" not in update.message


def test_the_evidence_rests_on_the_cores_figures_alone() -> None:
    base = cpu_record("local-ci", BASE_ROUNDS)
    run = cpu_record("run", BASE_ROUNDS, other=1.5, steal=0.2)
    evidence = machine_evidence(run, base, "update_actor")
    assert evidence == MachineEvidence(other_cores=1.5, steal_cores=0.2, base_other_cores=0.0)
    assert evidence.contended
    # one side's figures suffice: an older baseline, or a run on an external Ray
    assert machine_evidence(run, cpu_record("old", BASE_ROUNDS, other=None), "update_actor").contended
    contended_base = cpu_record("local-ci", BASE_ROUNDS, other=0.9)
    assert machine_evidence(cpu_record("run", BASE_ROUNDS, other=None), contended_base, "update_actor").contended
    # neither side recorded any: no evidence, plain seconds and the pace decide
    assert machine_evidence(cpu_record("run", BASE_ROUNDS, other=None), cpu_record("b", BASE_ROUNDS, other=None),
                            "update_actor") is None
    assert machine_evidence(run, base, "gen") is None


def test_the_machine_figures_are_evidence_never_judged_rows() -> None:
    base = cpu_record("local-ci", BASE_ROUNDS)
    run = cpu_record("run", BASE_ROUNDS, other=1.5)
    assert not [c for c in compare(run, base, 0.15).comparisons if c.metric.startswith("machine/")]
    # a baseline saved with figures this version no longer records (a calibration's seconds) loads, unjudged
    old = record("old", hardware=CPU, phases={"update_actor": {"seconds": BASE_ROUNDS}},
                 metrics={machine_metric("calibration_s", "update_actor"): metric([0.01])})
    assert compare(run, old, 0.15).passed
    assert not [c for c in compare(run, old, 0.15).comparisons if c.metric.startswith("machine/")]


def test_a_phase_test_compares_only_its_own_phase() -> None:
    base = record("local-ci", phases={"update_actor": {"seconds": BASE_ROUNDS}, "gen": {"seconds": BASE_ROUNDS}})
    run = record(phases={"update_actor": {"seconds": SLOWER}, "gen": {"seconds": SLOWER}})
    full = compare(run, base, 0.15)
    only = compare(run, base, 0.15, phase="gen")
    assert {c.phase for c in only.comparisons} == {"gen"} < {c.phase for c in full.comparisons}
    failures = [c.metric for r in phase_comparisons(run, [base], "gen", 0.15) for c in r.failures]
    assert failures == ["timing_s/gen"]


def test_the_evidence_in_words() -> None:
    evidence = MachineEvidence(other_cores=0.1, steal_cores=0.2)
    assert not evidence.contended
    assert evidence.describe() == "other processes used 0.10 cores, the hypervisor took 0.20 cores"
    assert MachineEvidence(other_cores=0.1, steal_cores=0.0).describe() == "other processes used 0.10 cores"
    assert MachineEvidence(base_other_cores=0.1).describe() == ""  # the baseline's, below contention


# ----------------------------------------------------------------------------- the default tolerance
SLIGHTLY_SLOWER = [1.13, 1.14, 1.15, 1.16, 1.17]  # 1.12x the baseline: past 0.10, within 0.15
CPU_DEFAULT = default_tolerance(gpu=False)


def test_the_cpu_default_is_015_and_named_as_the_default() -> None:
    for default in (row(SLIGHTLY_SLOWER, tolerance=CPU_DEFAULT), row(SLIGHTLY_SLOWER, other=None, tolerance=CPU_DEFAULT),
                    row(SLIGHTLY_SLOWER, other=0.9, tolerance=CPU_DEFAULT)):
        assert (default.verdict, default.tolerance) == ("pass", 0.15)
        assert "tolerance 0.15, the default)" in default.message
    assert "tolerance 0.15, the default)" in row(SLOWER, tolerance=CPU_DEFAULT).message


def test_a_chosen_tolerance_always_wins_over_the_default() -> None:
    chosen = row(SLIGHTLY_SLOWER, None, tolerance=0.10)  # --rl-tolerance=0.10 or the ini file
    assert (chosen.verdict, chosen.tolerance) == ("fail", 0.10) and "the default" not in chosen.message
    from_file = row(SLIGHTLY_SLOWER, None, tolerance=CPU_DEFAULT, tolerances={"timing_s": 0.10})
    assert (from_file.verdict, from_file.tolerance) == ("fail", 0.10) and "the default" not in from_file.message


def test_the_options_record_the_tolerance_the_verdicts_apply() -> None:
    import json

    from pytest_rlbench.options.parsed import RLBenchOptions

    options = RLBenchOptions(tolerance=CPU_DEFAULT)
    assert json.dumps(options.to_dict()["tolerance"]) == "0.15"
    assert type(options.to_dict()["tolerance"]) is float  # a plain number in the JSON report
    assert RLBenchOptions(tolerance=0.3).to_dict()["tolerance"] == 0.3


# ----------------------------------------------------------------------------- CPU use from /proc
def snapshot(wall: float, busy: int, steal: int, ours: dict[int, int]) -> CpuSnapshot:
    return CpuSnapshot(wall, busy, steal, ours)


def test_cores_used_outside_the_session_and_stolen() -> None:
    before = snapshot(0.0, 1000, 10, {1: 100, 2: 50})
    # 2 s at 100 ticks/s: 300 busy ticks, of which ours 150 (pid 1: +100, pid 2: +20, new pid 3: 30)
    after = snapshot(2.0, 1300, 50, {1: 200, 2: 70, 3: 30})
    other, steal = cores_used(before, after, 100.0)
    assert (other, steal) == (pytest.approx(0.75), pytest.approx(0.2))


def test_descendants_are_followed_through_every_generation_and_nothing_else() -> None:
    table = [(10, 1, 5), (11, 10, 7), (12, 11, 9), (20, 1, 100)]
    assert descendants_ticks(table, 10) == {10: 5, 11: 7, 12: 9}


BUSY_CHILD = "import time\nt = time.process_time()\nwhile time.process_time() - t < {seconds}: pass"
# Starts a busy loop that is no descendant of the session (its parent exits at once, so the loop is
# re-parented away from this process) and prints its pid.
OUTSIDE = (
    "import subprocess, sys\n"
    "loop = subprocess.Popen([sys.executable, '-c', {busy!r}], start_new_session=True,\n"
    "                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    "print(loop.pid, flush=True)\n"
)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc (Linux)")
def test_a_watch_sees_a_busy_process_outside_the_session_and_not_the_sessions_own() -> None:
    def watched(run) -> dict[str, list[float]]:
        watch = machine_load.MachineWatch()
        watch.start()
        run()
        watch.stop()
        return watch.figures()

    # Against a quiet window of the same length just before, not against zero: whatever else the
    # machine runs shows in both windows, and a child counted as another's would add about a core.
    quiet = watched(lambda: time.sleep(1.0))
    busy = watched(lambda: subprocess.run([sys.executable, "-c", BUSY_CHILD.format(seconds=1.0)], check=True))
    assert set(busy) == {"other_cores", "steal_cores"} and busy["steal_cores"][0] >= 0
    assert busy["other_cores"][0] < quiet["other_cores"][0] + 0.5, (quiet, busy)

    launcher = subprocess.run([sys.executable, "-c", OUTSIDE.format(busy=BUSY_CHILD.format(seconds=60))],
                              capture_output=True, text=True, check=True)
    outside = int(launcher.stdout.split()[0])
    try:
        time.sleep(0.3)  # past the interpreter's start
        watch = machine_load.MachineWatch()
        watch.start()
        time.sleep(1.0)
        watch.stop()
    finally:
        os.kill(outside, signal.SIGKILL)
    assert watch.figures()["other_cores"][0] >= CONTENTION_CORES


# ----------------------------------------------------------------------------- exited children
def test_a_child_that_exited_between_snapshots_counts_as_the_sessions_not_as_other() -> None:
    # pid 2 used 50 ticks before the window and 30 in it, then exited: its parent reaped all 80. Of the
    # machine's 60 busy ticks the session's are those 30; the other 30 are another process's.
    before = snapshot(0.0, 1000, 0, {1: 100, 2: 50})
    after = snapshot(1.0, 1060, 0, {1: 180})
    assert cores_used(before, after, 100.0)[0] == pytest.approx(0.3)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc (Linux)")
def test_a_snapshot_counts_the_cpu_of_a_child_that_ran_and_exited() -> None:
    before, reaped_before = machine_load.cpu_snapshot(), resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", BUSY_CHILD.format(seconds=0.4)], check=True)
    after, reaped_after = machine_load.cpu_snapshot(), resource.getrusage(resource.RUSAGE_CHILDREN)
    assert before is not None and after is not None
    ticks = os.sysconf("SC_CLK_TCK")
    child_ticks = (reaped_after.ru_utime + reaped_after.ru_stime - reaped_before.ru_utime - reaped_before.ru_stime)
    assert child_ticks >= 0.4
    assert sum(after.ours.values()) - sum(before.ours.values()) >= 0.8 * child_ticks * ticks
