"""The error-rate harness's own parts: the slowdown hook, a run's outcome from its report, the table."""

from __future__ import annotations

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
    assert slowed(phase, 0.5)(0.2) == "done"
    assert time.perf_counter() - start == pytest.approx(0.3, abs=0.08)


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
