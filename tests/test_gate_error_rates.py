"""The error-rate harness's own parts: the slowdown hook, a run's outcome from its report, the table."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from gate_error_rates import RunResult, ScenarioResult, outcome_of, table  # noqa: E402
from gate_slow_phase import slowed  # noqa: E402


def test_the_slowdown_sleeps_a_fraction_of_each_calls_own_time() -> None:
    def phase(seconds: float) -> str:
        time.sleep(seconds)
        return "done"

    start = time.perf_counter()
    assert slowed(phase, 0.5, on_gpu=False)(0.2) == "done"
    assert time.perf_counter() - start == pytest.approx(0.3, abs=0.08)


def test_the_work_slowdown_is_real_work_that_the_counters_see() -> None:
    from gate_slow_phase import burn_worker_cpu

    from trainer.work_counts import count_work

    # what a worker hands back in a counted round: the operand's fill and each added matmul
    products, work = burn_worker_cpu(None, 0.05, None, count=True)
    assert products >= 1 and work.ops == products + 1 and work.flops == products * 2 * 192**3, (products, work)
    assert burn_worker_cpu(None, 0.01, None, count=False)[1] is None
    # a counted round repeats the last timed call's products exactly, however slow the counters make it
    again, work = burn_worker_cpu(None, 0.0, 7, count=True)
    assert again == 7 and work.flops == 7 * 2 * 192**3, work

    def phase(seconds: float) -> str:
        time.sleep(seconds)
        return "done"

    _, asleep = count_work(lambda: slowed(phase, 0.5, on_gpu=False)(0.05))  # the sleep adds no work
    assert asleep.ops == 0 and asleep.flops == 0, asleep


def row(verdict: str, message: str, source: str = "base", mode: str = "gate") -> dict:
    return {"verdict": verdict, "message": message, "source": source, "mode": mode}


def test_a_runs_outcome_is_its_worst_verdict_against_the_saved_baseline() -> None:
    rows = [row("pass", "gen seconds: ok"), row("reference", "x", source="verl-7b", mode="reference")]
    assert outcome_of({"comparisons": rows}, "base") == ("passed", [])
    rows.append(row("inconclusive", "adv seconds: too few"))
    assert outcome_of({"comparisons": rows}, "base") == ("inconclusive", ["inconclusive: adv seconds: too few"])
    rows.append(row("fail", "ref seconds: slower"))
    outcome, lines = outcome_of({"comparisons": rows}, "base")
    assert outcome == "failed" and lines[-1] == "fail: ref seconds: slower"


def test_the_table_counts_each_outcome() -> None:
    result = ScenarioResult("slowdown", [RunResult(1, "failed", 1, 30.0), RunResult(2, "passed", 0, 31.0)])
    lines = table([result])
    assert lines[0].split() == ["scenario", "runs", "passed", "failed", "inconclusive", "errors"]
    assert lines[1].split() == ["slowdown", "2", "1", "1", "0", "0"]


def test_the_settle_finds_a_process_that_carries_an_earlier_sessions_mark() -> None:
    import os
    import subprocess

    from gate_error_rates import RUN_MARK, marked_processes

    def found() -> bool:
        return any(line.split()[0] == str(child.pid) for line in marked_processes())

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env={**os.environ, RUN_MARK: "x-1"})
    try:
        # Popen returns once the child's exec is under way; the kernel shows its new environment in
        # /proc a moment later (empty until then), so look again for a while
        deadline = time.monotonic() + 10
        while not found() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert found(), f"process {child.pid}, started with {RUN_MARK} set, is not among {marked_processes()}"
    finally:
        child.kill()
        child.wait()
    assert not any(line.split()[0] == str(child.pid) for line in marked_processes())


def test_each_phases_plain_ratio_the_sessions_pace_and_the_cores_beside() -> None:
    from gate_error_rates import phase_figures
    from test_session_pace import session
    from test_verdict_machine import BASE_ROUNDS, SLOWER, cpu_record, with_cores

    run = with_cores(session("run", {"old_log_prob": 1.3}, everything=1.2), 0.5)
    row = phase_figures(run, session("base"))["old_log_prob"]
    assert row["ratio"] == pytest.approx(1.56) and row["pace"] == pytest.approx(1.2)
    assert row["other_cores"] == 0.5
    # too few peers to pace update_actor (gen alone): no pace, the plain ratio and the cores still
    row = phase_figures(cpu_record("run", SLOWER, other=0.5, steal=0.1), cpu_record("base", BASE_ROUNDS))["update_actor"]
    assert row["ratio"] == pytest.approx(1.42 / 1.02) and "pace" not in row
    assert row["other_cores"] == 0.5 and row["steal_cores"] == 0.1


def test_rejudge_recounts_the_kept_reports_at_another_tolerance(tmp_path: Path) -> None:
    from gate_error_rates import rejudge
    from test_verdict_machine import BASE_ROUNDS, cpu_record

    from pytest_rlbench.records.record import save_record
    from pytest_rlbench.reports.json_report import build_report
    from pytest_rlbench.verdict.compare import compare

    base = cpu_record("base", BASE_ROUNDS)
    save_record(base, tmp_path / "base.json")
    for name, seconds in (("unchanged-1", [t * 1.18 for t in BASE_ROUNDS]), ("unchanged-2", BASE_ROUNDS)):
        run = cpu_record(name, seconds)  # the first 1.18x: past 0.15, within 0.20
        report = build_report(run, [compare(run, base, 0.15)])
        (tmp_path / f"{name}.report.json").write_text(json.dumps(report))
    assert rejudge(tmp_path, 0.15)[1].split() == ["unchanged", "2", "1", "1", "0", "0"]
    assert rejudge(tmp_path, 0.20)[1].split() == ["unchanged", "2", "2", "0", "0", "0"]


def test_a_reports_run_record_keeps_the_rounds_and_the_machines_figures() -> None:
    from gate_error_rates import record_of_report
    from test_verdict_machine import BASE_ROUNDS, cpu_record

    from pytest_rlbench.reports.json_report import build_report

    run = cpu_record("run", BASE_ROUNDS, other=0.5, steal=0.1)
    back = record_of_report(json.loads(json.dumps(build_report(run, []))))
    assert back.phases["update_actor"].seconds == BASE_ROUNDS
    assert back.metrics["machine/other_cores/update_actor"].value == [0.5]
    assert back.metrics["machine/steal_cores/update_actor"].value == [0.1]


def test_the_recount_judges_as_the_gate_does_pace_and_contention(tmp_path: Path) -> None:
    from gate_error_rates import rejudge
    from test_session_pace import session
    from test_verdict_machine import with_cores

    from pytest_rlbench.records.record import save_record
    from pytest_rlbench.reports.json_report import build_report

    save_record(with_cores(session("base"), 0.0), tmp_path / "base.json")
    sessions = {
        "unchanged-1": with_cores(session("unchanged-1", everything=1.4), 0.0),  # slower alike: inconclusive
        "contention-1": with_cores(session("contention-1", everything=1.4), 1.7),  # the same, contended: fails
        "slowdown-1": with_cores(session("slowdown-1", {"old_log_prob": 1.25}), 0.0),  # one phase: fails
    }
    for name, run in sessions.items():
        (tmp_path / f"{name}.report.json").write_text(json.dumps(build_report(run, [])))
    lines = rejudge(tmp_path, 0.20)
    assert lines[1].split() == ["unchanged", "1", "0", "0", "1", "0"]
    assert lines[2].split() == ["contention", "1", "0", "1", "0", "0"]
    assert lines[3].split() == ["slowdown", "1", "0", "1", "0", "0"]


def test_the_gpu_rates_read_each_sessions_slowed_methods_and_fraction_from_its_name() -> None:
    import argparse

    from gate_gpu_rates import parse_name, parse_phase_tolerance

    assert parse_name("same") == ((), None)
    assert parse_name("update_actor_0.05") == (("update_actor",), "0.05")
    assert parse_name("update_actor_generate_sequences_0.25") == (("update_actor", "generate_sequences"), "0.25")
    assert parse_name("compute_old_log_prob_0.25") == (("compute_old_log_prob",), "0.25")
    assert parse_phase_tolerance("update_actor=0.06") == ("update_actor", 0.06)
    with pytest.raises(argparse.ArgumentTypeError, match="expected PHASE=VALUE"):
        parse_phase_tolerance("update_actor")


def test_a_slowed_pair_is_caught_on_its_phase_or_on_one_that_holds_it() -> None:
    from gate_gpu_rates import catch_of

    assert catch_of(["reward", "update_actor"], ("update_actor",), "failed") == "caught"
    assert catch_of(["step"], ("update_actor",), "failed") == "caught in step"  # the step holds the update
    assert catch_of(["reward"], ("update_actor",), "failed") == "missed (failed)"  # a phase beside it is no catch
    assert catch_of([], ("generate_sequences", "gen"), "passed") == "missed (passed)"
    assert catch_of(["gen"], ("generate_sequences", "gen"), "failed") == "caught"


def test_the_gpu_rates_skip_each_sessions_saved_baseline_and_can_drop_the_counts(tmp_path: Path) -> None:
    from gate_gpu_rates import sessions
    from test_counted_work import BASE_WORK, with_counts
    from test_session_pace import session

    from pytest_rlbench.records.record import save_record
    from pytest_rlbench.reports.json_report import build_report

    for name in ("gate16x8-01-same", "gate16x8-02-update_actor_0.05"):
        record = with_counts(session(name), BASE_WORK)
        (tmp_path / f"{name}.json").write_text(json.dumps(build_report(record, [])))
        save_record(record, tmp_path / f"{name}.baseline.json")  # beside each report, as gate16x8 keeps it
    found = sessions([f"A={tmp_path}"])
    assert [(s.name, s.methods) for s in found] == [("same", ()), ("update_actor_0.05", ("update_actor",))]
    assert "work/flops/update_actor" in found[0].record.metrics
    bare = sessions([f"A={tmp_path}"], counts=False)
    assert not any(m.startswith("work/") for s in bare for m in s.record.metrics)
