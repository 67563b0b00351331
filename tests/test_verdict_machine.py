"""A phase's time judged relative to the machine's speed: a slower machine is inconclusive, a slower
phase fails, CPU contention fails and is named; the machine's figures are never judged themselves;
and the figures' own plumbing (CPU use from /proc, a phase's calibrations)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from typing import Any

import pytest
from test_compare import record

from pytest_rlbench import machine_load
from pytest_rlbench import verdict as verdict_module
from pytest_rlbench.compare import compare, machine_evidence, phase_failures
from pytest_rlbench.machine_load import CpuSnapshot, cores_used, descendants_ticks, machine_metric
from pytest_rlbench.metrics import default_tolerance
from pytest_rlbench.verdict import CONTENTION_CORES, OWN_BUSY_CORES, MachineEvidence, relative_samples


@pytest.fixture(autouse=True)
def relative_verdict_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests cover the relative verdict's machinery, which is off by default."""
    monkeypatch.setattr(verdict_module, "RELATIVE_VERDICT", True)

CPU = {"device": "cpu", "gpus_per_node": None, "gpu_model": None, "cpu_model": "AMD EPYC", "cpus_per_node": 2}
BASE_ROUNDS = [1.0, 1.01, 1.02, 1.03, 1.04]
BASE_CAL = [0.010, 0.0101, 0.0099, 0.0100, 0.0100]


def metric(values: list[float], unit: str = "s") -> dict[str, Any]:
    return {"value": values, "unit": unit, "higher_is_better": False}


def cpu_record(
    name: str, seconds: list[float], calibration: list[float] | None, other: float = 0.0, own: float | None = None,
    **changes: Any,
) -> Any:
    metrics = {}
    if calibration is not None:
        metrics[machine_metric("calibration_s", "update_actor")] = metric(calibration)
        metrics[machine_metric("other_cores", "update_actor")] = metric([other], "cores")
        metrics[machine_metric("steal_cores", "update_actor")] = metric([0.0], "cores")
        if own is not None:
            metrics[machine_metric("own_cores", "update_actor")] = metric([own], "cores")
    return record(name, hardware=CPU, phases={"update_actor": {"seconds": seconds}}, metrics=metrics, **changes)


def row(
    run_seconds: list[float], run_cal: list[float] | None, other: float = 0.0, base_cal: Any = BASE_CAL,
    tolerance: float = 0.15, own: float | None = None, **base_changes: Any,
) -> Any:
    base = cpu_record("local-ci", BASE_ROUNDS, base_cal, **base_changes)
    result = compare(cpu_record("run", run_seconds, run_cal, other, own), base, tolerance)
    assert result.mode == "gate"
    return {c.metric: c for c in result.comparisons}["timing_s/update_actor"]


SLOWER = [1.4, 1.41, 1.42, 1.43, 1.44]  # every round 1.4x the baseline's


def test_a_machine_that_ran_slower_as_a_whole_is_inconclusive_and_says_how_much_slower() -> None:
    # the phase 1.4x slower in plain seconds, and the calibration before each round 1.4x slower too
    verdict = row(SLOWER, [c * 1.4 for c in BASE_CAL])
    assert (verdict.verdict, verdict.reason) == ("inconclusive", "machine slower")
    assert "the machine itself ran 1.40x slower than in the baseline's session" in verdict.message
    assert "other processes used 0.00 cores" in verdict.message
    assert "machine slower: slower in seconds (p = 0.004 < 0.01, 5 vs 5 rounds) but" in verdict.message
    assert "relative to it the phase is at ratio 0.99 (within tolerance)" in verdict.message


def test_by_default_plain_seconds_decide_and_the_machine_figures_are_only_shown(monkeypatch) -> None:
    # the measured calibration was bimodal on the CI VM (verdict.RELATIVE_VERDICT): it must not decide
    monkeypatch.setattr(verdict_module, "RELATIVE_VERDICT", False)
    slower_machine = row(SLOWER, [c * 1.4 for c in BASE_CAL])
    assert (slower_machine.verdict, slower_machine.reason) == ("fail", "slower")
    assert "the machine's figures, not used by the verdict: calibration" in slower_machine.message
    # a phase within tolerance in seconds passes whatever the calibration says
    assert row([1.1, 1.11, 1.12, 1.13, 1.14], [c / 1.3 for c in BASE_CAL]).verdict == "pass"


def test_a_phase_slower_than_the_machine_fails() -> None:
    # the machine 1.1x slower, the phase 1.4x: 1.27x relative to the machine
    verdict = row(SLOWER, [c * 1.1 for c in BASE_CAL])
    assert (verdict.verdict, verdict.reason) == ("fail", "slower")
    assert "relative to the machine's speed ratio 1.27 (p = 0.004 < 0.01, 5 vs 5 rounds)" in verdict.message


def test_a_slower_phase_hidden_by_a_faster_machine_still_fails() -> None:
    # plain seconds within tolerance (1.1x), but the machine ran 1.3x faster: 1.43x relative to it
    verdict = row([1.1, 1.11, 1.12, 1.13, 1.14], [c / 1.3 for c in BASE_CAL])
    assert (verdict.verdict, verdict.reason) == ("fail", "slower")
    assert "the machine itself ran 1.30x faster" in verdict.message


def test_contention_beside_the_session_fails_and_is_named_although_the_calibration_slowed_as_much() -> None:
    verdict = row(SLOWER, [c * 1.4 for c in BASE_CAL], other=0.9)
    assert (verdict.verdict, verdict.reason) == ("fail", "slower")
    assert "other processes used 0.90 cores: CPU contention" in verdict.message
    assert CONTENTION_CORES < 0.9
    # contention without a slower phase passes
    assert row(BASE_ROUNDS, BASE_CAL, other=0.9).verdict == "pass"


def test_a_baseline_saved_under_contention_leaves_plain_seconds_to_decide() -> None:
    # the baseline's calibration slowed 3x by contention beside its session: relative figures would
    # read the unchanged phase as 3x slower; the plain seconds pass it and the verdict stays a pass
    base = cpu_record("local-ci", BASE_ROUNDS, [c * 3 for c in BASE_CAL], other=1.2)
    result = compare(cpu_record("run", BASE_ROUNDS, BASE_CAL), base, 0.15)
    assert result.passed and not result.inconclusive
    assert machine_evidence(cpu_record("run", BASE_ROUNDS, BASE_CAL), base, "update_actor").contended


def test_without_the_machine_figures_on_both_sides_plain_seconds_decide() -> None:
    assert (row(SLOWER, None).verdict, row(SLOWER, [c * 1.4 for c in BASE_CAL], base_cal=None).verdict) == (
        "fail",
        "fail",
    )


def test_the_machine_figures_are_evidence_never_judged_rows() -> None:
    base = cpu_record("local-ci", BASE_ROUNDS, BASE_CAL)
    run = cpu_record("run", BASE_ROUNDS, [c * 3 for c in BASE_CAL], other=1.5)
    assert not [c for c in compare(run, base, 0.15).comparisons if c.metric.startswith("machine/")]
    evidence = machine_evidence(run, base, "update_actor")
    assert evidence is not None and evidence.contended and evidence.speed_ratio == pytest.approx(3.0)
    assert machine_evidence(run, base, "gen") is None


def test_a_phase_test_compares_only_its_own_phase() -> None:
    base = record("local-ci", phases={"update_actor": {"seconds": BASE_ROUNDS}, "gen": {"seconds": BASE_ROUNDS}})
    run = record(phases={"update_actor": {"seconds": SLOWER}, "gen": {"seconds": SLOWER}})
    full = compare(run, base, 0.15)
    only = compare(run, base, 0.15, phase="gen")
    assert {c.phase for c in only.comparisons} == {"gen"} < {c.phase for c in full.comparisons}
    assert [c.metric for c in phase_failures(run, [base], "gen", 0.15)] == ["timing_s/gen"]


def test_relative_samples_divide_each_round_by_the_phases_median_calibration() -> None:
    # one slow calibration (a scheduler hiccup) moves no round against the others
    assert relative_samples((2.0, 4.0, 6.0), (1.0, 1.0, 9.0)) == (2.0, 4.0, 6.0)
    evidence = MachineEvidence((0.02,), (0.01,), other_cores=0.1, steal_cores=0.2)
    assert not evidence.contended and "the hypervisor took 0.20 cores" in evidence.describe()


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


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc (Linux)")
def test_a_watch_records_each_timed_rounds_calibration_and_the_load() -> None:
    watch = machine_load.MachineWatch()
    watch.start()
    for _ in range(3):  # one warm-up round, two timed
        watch.calibrate()
    watch.stop()
    figures = watch.figures(2)
    assert len(figures["calibration_s"]) == 2 and all(0 < s < 5 for s in figures["calibration_s"])
    assert figures["other_cores"][0] >= 0 and figures["steal_cores"][0] >= 0


# ----------------------------------------------------------------------------- which default tolerance
SLIGHTLY_SLOWER = [1.18, 1.19, 1.2, 1.21, 1.22]  # 1.17x the baseline: past 0.15, within 0.20
CPU_DEFAULT = default_tolerance(gpu=False)


def test_the_015_default_applies_only_relative_to_the_machine_and_020_where_plain_seconds_decide() -> None:
    calibrated = row(SLIGHTLY_SLOWER, BASE_CAL, tolerance=CPU_DEFAULT)
    assert (calibrated.verdict, calibrated.tolerance) == ("fail", 0.15)
    assert "tolerance 0.15, the default relative to the machine's speed" in calibrated.message
    # a baseline saved before the calibration existed; a contended run: the host's drift is in the seconds
    for plain in (row(SLIGHTLY_SLOWER, BASE_CAL, base_cal=None, tolerance=CPU_DEFAULT),
                  row(SLIGHTLY_SLOWER, None, tolerance=CPU_DEFAULT),
                  row(SLIGHTLY_SLOWER, BASE_CAL, other=0.9, tolerance=CPU_DEFAULT)):
        assert (plain.verdict, plain.tolerance) == ("pass", 0.20)
        assert "tolerance 0.20, the default in plain seconds" in plain.message


def test_a_chosen_tolerance_always_wins_over_either_default() -> None:
    chosen = row(SLIGHTLY_SLOWER, None, tolerance=0.15)  # --rl-tolerance=0.15 or the ini file
    assert (chosen.verdict, chosen.tolerance) == ("fail", 0.15) and "the default" not in chosen.message
    from_file = row(SLIGHTLY_SLOWER, None, tolerance=CPU_DEFAULT, tolerances={"timing_s": 0.15})
    assert (from_file.verdict, from_file.tolerance) == ("fail", 0.15) and "the default" not in from_file.message


def test_the_options_record_the_tolerance_the_verdicts_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from pytest_rlbench.options import RLBenchOptions

    options = RLBenchOptions(tolerance=CPU_DEFAULT)
    monkeypatch.setattr(verdict_module, "RELATIVE_VERDICT", False)  # the default: plain seconds decide
    assert json.dumps(options.to_dict()["tolerance"]) == "0.2"  # not the relative verdict's 0.15
    monkeypatch.setattr(verdict_module, "RELATIVE_VERDICT", True)
    assert options.to_dict()["tolerance"] == 0.15
    assert RLBenchOptions(tolerance=0.3).to_dict()["tolerance"] == 0.3  # a chosen one, either way


# ----------------------------------------------------------------------------- the session busy meanwhile
def test_a_session_busy_during_its_calibrations_is_judged_in_plain_seconds_and_says_so() -> None:
    # the phase and the calibration both 1.4x slower because the session's own workers stayed busy:
    # relative figures would call it "machine slower"; plain seconds fail it
    busy = row(SLOWER, [c * 1.4 for c in BASE_CAL], own=0.5)
    assert (busy.verdict, busy.reason) == ("fail", "slower")
    assert "the session's own processes used the run's 0.50 cores during the calibrations" in busy.message
    assert "judged in plain seconds" in busy.message
    assert row(SLOWER, [c * 1.4 for c in BASE_CAL], own=0.1).verdict == "inconclusive"
    evidence = MachineEvidence((0.01,), (0.01,), own_cores=0.0, base_own_cores=0.3)
    assert evidence.session_busy and not evidence.calibrated and "the baseline's 0.30 cores" in evidence.busy_text()


BUSY_CHILD = "import time\nt = time.process_time()\nwhile time.process_time() - t < {seconds}: pass"


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc (Linux)")
def test_a_watch_sees_the_sessions_own_processes_busy_during_its_calibrations() -> None:
    watch = machine_load.MachineWatch()
    for _ in range(2):
        watch.calibrate()
    assert watch.figures(2)["own_cores"][0] < OWN_BUSY_CORES  # this process alone: its other threads idle
    # two busy children: each may get only part of a core on a shared 2-core machine
    children = [subprocess.Popen([sys.executable, "-c", BUSY_CHILD.format(seconds=60)]) for _ in range(2)]
    try:
        time.sleep(0.5)  # past the interpreters' start
        for _ in range(3):
            watch.calibrate()
    finally:
        for child in children:
            child.kill()
            child.wait()
    assert watch.figures(3)["own_cores"][0] >= OWN_BUSY_CORES


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


# ----------------------------------------------------------------------------- where the calibration runs
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc (Linux)")
def test_the_calibration_runs_inside_each_ray_worker_and_its_threads_are_not_counted_as_load() -> None:
    import ray

    @ray.remote
    class Worker:
        def pid(self) -> int:
            return os.getpid()

    class Group:  # what workers_calibration reads of a WorkerGroup: its actors and its bounded wait
        def __init__(self, workers: list[Any]) -> None:
            self.workers = workers

        def wait(self, refs: list[Any], phase: str) -> list[Any]:
            return ray.get(refs, timeout=120)

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # never another session's
    try:
        actors = [Worker.remote() for _ in range(2)]
        pids = ray.get([actor.pid.remote() for actor in actors])
        calibrate = machine_load.workers_calibration(Group(actors))
        seconds, threads = calibrate()
        assert 0 < seconds < 5 and len(threads) == 2
        # each figure was timed by a thread of a worker process, none of this one's
        assert all(os.path.exists(f"/proc/{pid}/task/{tid}") for pid, tid in zip(pids, threads, strict=True))
        assert not any(os.path.exists(f"/proc/{os.getpid()}/task/{tid}") for tid in threads)
        watch = machine_load.MachineWatch(calibrate)
        for _ in range(3):
            watch.calibrate()
        # the workers' calibrating threads and this thread's waiting are not the session's load
        assert watch.figures(3)["own_cores"][0] < OWN_BUSY_CORES
    finally:
        ray.shutdown()


def test_a_calibration_is_the_fastest_of_its_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    passes = iter([0.012, 0.008, 0.030])  # the third pass preempted: it does not count
    monkeypatch.setattr(machine_load, "calibration_pass", lambda: next(passes))
    assert machine_load.calibration_round() == 0.008
