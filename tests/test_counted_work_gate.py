"""Counted work end to end, through pytester: a CPU session records each phase's work/* counts in its
baseline, and against that baseline a session slower alike passes where the work was the same and
fails the phase that dispatched more (``WorkEvidence`` in pytest_rlbench/verdict/judge.py). A phase
whose rounds name their own work (``tokens`` a function, as a generation's) records what its counted
round did beside the counts.

The phases are a controlled sleep (their time) beside a few matmuls (their work), counted in this
process: the suite uses ``rl_bench`` alone, no trainer; the bundled trainer's workers count their own
share (trainer/driver/worker_group.py), tested in tests/test_counted_work_trainer.py."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.usefixtures("plugin_deps_loaded", "steady_machine")  # see tests/conftest.py

SUITE = """
import time
import pytest
import torch
from pytest_rlbench.records.record import TokenCounts

DELAY, EXTRA = {delay}, {extra}
A = torch.eye(8)


def phase(matmuls):
    time.sleep(DELAY)
    x = A
    for _ in range(matmuls):
        x = x @ A
    return x


@pytest.mark.rl_phase("old_log_prob")
def test_old_log_prob(rl_bench):  # its rounds name their own work, as a generation's do
    rl_bench(lambda: phase(2), tokens=lambda x: TokenCounts(num_sequences=2, prompt_tokens=8, response_tokens=24))


@pytest.mark.rl_phase("ref")
def test_ref(rl_bench):
    rl_bench(lambda: phase(2))


@pytest.mark.rl_phase("update_actor")
def test_update_actor(rl_bench):
    rl_bench(lambda: phase(2 + EXTRA))
"""


@pytest.fixture
def steady_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nobody else on the CPU, as the gate sees it: the phases' time is a sleep (as in tests/test_bench_gate.py)."""
    from pytest_rlbench.verdict import machine_load

    monkeypatch.setattr(machine_load, "cores_used", lambda before, after, ticks_per_s: (0.0, 0.0))


def run(pytester: pytest.Pytester, delay: float, extra: int, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_suite=SUITE.format(delay=delay, extra=extra))
    return pytester.runpytest("--rl-rounds=5", "--rl-warmup-rounds=1", "-p", "no:randomly", *args)


def test_more_work_turns_a_session_slower_alike_into_a_failure(pytester: pytest.Pytester) -> None:
    saved = pytester.path / "base.json"
    run(pytester, 0.06, 0, f"--rl-save-baseline={saved}").assert_outcomes(passed=6)
    metrics = json.loads(saved.read_text())["metrics"]
    # two matmuls and the sleep's nothing: 2 ops of 2 x 8^3 FLOPs each, the same in every phase
    assert metrics["work/ops/update_actor"]["value"] == 2.0  # a single value is stored as a number
    assert metrics["work/flops/update_actor"]["value"] == 2 * 2 * 8**3
    assert metrics["work/response_tokens/old_log_prob"]["value"] == 24  # what its counted round did
    assert "work/response_tokens/update_actor" not in metrics  # its work is the warm batch's, not a round's own

    # every phase 1.4x slower, the same work: the machine; it passes, and the verdict says why
    report = pytester.path / "same.json"
    same = run(pytester, 0.084, 0, f"--rl-baseline={saved}", f"--rl-report={report}")
    assert same.ret == pytest.ExitCode.OK, same.stdout.str()
    update = next(
        c for c in json.loads(report.read_text())["comparisons"] if c["metric"] == "timing_s/update_actor"
    )
    assert (update["verdict"], update["reason"]) == ("pass", "same work"), update["message"]
    assert "the work was the same (ops 2 -> 2, FLOPs 2,048 -> 2,048)" in update["message"]

    # the same slowdown, with update_actor doing twice the matmuls: a regression, whatever the pace
    more = run(pytester, 0.084, 2, f"--rl-baseline={saved}")
    assert more.ret == pytest.ExitCode.TESTS_FAILED, more.stdout.str()
    more.assert_outcomes(passed=5, failed=1)
    out = more.stdout.str()
    assert "FAILED test_suite.py::test_update_actor[gate]" in out
    failed = next(line for line in out.splitlines() if line.startswith("update_actor seconds"))
    assert ": more work: slower in seconds" in failed and "(ops 2 -> 4, FLOPs 2,048 -> 4,096)" in failed, (
        failed
    )
