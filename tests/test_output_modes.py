"""Outputs written with the user's umask (issue 30, item 7), and the saving session's note that each phase is
timed three times.

The report, its chart and a saved baseline are written through a temporary file that ``mkstemp`` makes
0o600; each must end with the mode a plain ``open`` gives (0o666 less the umask), so a CI runner's team
can read them.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from shared_parts import TWO_PHASE_SUITE

from pytest_rlbench.records.files import write_text_atomic

pytestmark = pytest.mark.usefixtures("plugin_deps_loaded")  # see tests/conftest.py

SUITE = TWO_PHASE_SUITE


@pytest.fixture
def umask() -> Iterator[object]:
    """Set the process's umask for one test (``umask(0o022)``), and restore the one before."""
    before = os.umask(0o077)
    os.umask(before)
    yield os.umask
    os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize(("mask", "expected"), [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_a_written_file_gets_the_mode_open_would_give(
    tmp_path: Path, umask, mask: int, expected: int
) -> None:
    umask(mask)
    path = write_text_atomic(tmp_path / "r.json", "{}\n")
    assert oct(mode(path)) == oct(expected)
    assert not list(tmp_path.glob(".r.json.*"))  # no temporary file left


def test_rewriting_a_file_applies_the_umask_of_now(tmp_path: Path, umask) -> None:
    umask(0o077)
    path = write_text_atomic(tmp_path / "b.json", "{}\n")
    umask(0o022)
    write_text_atomic(path, "{}\n")
    assert oct(mode(path)) == oct(0o644)


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_suite=SUITE)
    return pytester.runpytest("--rl-rounds=2", "--rl-warmup-rounds=0", "-p", "no:randomly", *args)


def test_report_chart_and_baseline_of_a_session_honour_the_umask(pytester: pytest.Pytester, umask) -> None:
    umask(0o022)
    saved, report = pytester.path / "out" / "b.json", pytester.path / "out" / "r.json"
    run(pytester, f"--rl-save-baseline={saved}", f"--rl-report={report}").assert_outcomes(passed=4)
    chart = report.with_suffix(".png")
    modes = {p.name: oct(mode(p)) for p in (saved, report, chart)}
    assert modes == {"b.json": "0o644", "r.json": "0o644", "r.png": "0o644"}


def test_saving_a_baseline_on_cpu_workers_says_each_phase_is_timed_three_times(pytester: pytest.Pytester) -> None:
    saved = pytester.path / "b.json"
    result = run(pytester, f"--rl-save-baseline={saved}")
    result.assert_outcomes(passed=4)  # two benchmarks and their gates, which time each phase again
    lines = result.stdout.lines
    note = [i for i, line in enumerate(lines) if "each phase is timed three times" in line]
    first_test = next(i for i, line in enumerate(lines) if line.startswith("test_suite.py"))
    assert len(note) == 1 and note[0] < first_test, lines  # once, before the first test runs
    assert lines[note[0]] == (
        "rlbench: saving a baseline: each phase is timed three times, by its benchmark and twice more at "
        "the end of the session (all kept in b.json; a gate reads the median block)"
    )


def test_a_session_that_saves_nothing_says_nothing_of_timing_again(pytester: pytest.Pytester) -> None:
    result = run(pytester)
    result.assert_outcomes(passed=2)
    assert "timed three times" not in result.stdout.str()
