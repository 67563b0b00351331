"""The session's outputs are never lost (issue 14, defects 1 and 2), through pytester on a sleep workload.

Output paths are checked at start-up (writable, distinct from each other and from the report's
chart); at the end each file is written on its own and atomically, a failure is one line and a
non-zero exit; a baseline is saved only from a complete session, and the report of an incomplete one
says "passed": false.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from shared_parts import TWO_PHASE_SUITE

from pytest_rlbench.records.files import clashing_outputs, dumps_report, write_atomic, write_problem

pytestmark = pytest.mark.usefixtures("plugin_deps_loaded")  # see tests/conftest.py

SUITE = TWO_PHASE_SUITE + """
def test_last():
    {last}
"""


def run(pytester: pytest.Pytester, *args: str, last: str = "pass") -> pytest.RunResult:
    pytester.makepyfile(test_suite=SUITE.format(last=last))
    # no_reraise_ctrlc: a KeyboardInterrupt of the inner session must not stop this one
    return pytester.runpytest(
        "--rl-rounds=2", "--rl-warmup-rounds=0", "-p", "no:randomly", *args, no_reraise_ctrlc=True
    )


# ----------------------------------------------------------------------------- start-up checks
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--rl-report=/proc/nope/r.json"], "cannot write in '/proc/nope'"),
        (["--rl-save-baseline=/proc/nope/b.json"], "--rl-save-baseline expects a file it can write"),
        (["--rl-report=r.png"], "--rl-report and the report's chart are the same file"),
        (
            ["--rl-report=x.json", "--rl-save-baseline=x.json"],
            "--rl-report and --rl-save-baseline are the same",
        ),
        (["--rl-report=x.json", "--rl-save-baseline=x.png"], "the report's chart and --rl-save-baseline are"),
    ],
)
def test_an_output_that_cannot_be_written_is_a_usage_error_before_any_test(
    pytester: pytest.Pytester, args: list[str], expected: str
) -> None:
    result = run(pytester, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert expected in result.stderr.str()
    assert not list(pytester.path.glob("*.png")) and not list(pytester.path.glob("*.json"))


def test_the_probe_refuses_directories_and_read_only_files_and_leaves_nothing(tmp_path: Path) -> None:
    assert write_problem(tmp_path) == "it is a directory"
    locked = tmp_path / "locked.json"
    locked.write_text("{}")
    locked.chmod(0o444)
    assert write_problem(locked) == "the file is read-only"
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro").chmod(0o555)
    assert "read-only" in (write_problem(tmp_path / "ro" / "r.json") or "")
    (tmp_path / "file").write_text("")
    assert "cannot write in" in (write_problem(tmp_path / "file" / "r.json") or "")
    assert write_problem(tmp_path / "new" / "deeper" / "r.json") is None
    assert not (tmp_path / "new").exists()  # the probe's directories are removed again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "locked.json", "ro"]


def test_paths_clash_after_resolution(tmp_path: Path) -> None:
    assert clashing_outputs({"a": tmp_path / "x.json", "b": tmp_path / "sub" / ".." / "x.json"})
    assert clashing_outputs({"a": tmp_path / "x.json", "b": None, "c": tmp_path / "y.json"}) is None


# ----------------------------------------------------------------------------- writing at the end
def test_a_failed_write_is_one_line_and_never_stops_the_other_outputs(pytester: pytest.Pytester) -> None:
    out = pytester.path / "out"
    # The report's directory is fine at start-up; the last test puts a file where it should be.
    result = run(
        pytester,
        f"--rl-report={out / 'r.json'}",
        f"--rl-save-baseline={pytester.path / 'b.json'}",
        last=f"open({str(out)!r}, 'w').close()",
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.assert_outcomes(passed=5)  # with the two gates that time each phase again for the baseline
    text = result.stdout.str()
    assert "INTERNALERROR" not in text and "Traceback" not in text
    assert f"pytest-rlbench: could not write the JSON report '{out / 'r.json'}': File exists: '{out}'" in text
    assert f"pytest-rlbench: could not write the chart '{out / 'r.png'}'" in text
    assert "this run, seconds per round" in text and "reference 'verl-7b'" in text  # the summary is still printed
    assert json.loads((pytester.path / "b.json").read_text())["phases"].keys() == {
        "old_log_prob",
        "update_actor",
    }
    assert f"wrote {pytester.path / 'b.json'}" in text


def test_a_failed_write_leaves_the_previous_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "r.json"
    target.write_text('{"old": true}')

    def half_then_fail(temp: Path) -> None:
        temp.write_text('{"new": ')
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        write_atomic(target, half_then_fail)
    assert target.read_text() == '{"old": true}'
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left


def test_non_finite_figures_are_written_as_null() -> None:
    report = {"passed": True, "comparisons": [{"ratio": math.inf, "measured": 1.5}], "x": (math.nan, 2.0)}
    assert json.loads(dumps_report(report)) == {
        "passed": True,
        "comparisons": [{"ratio": None, "measured": 1.5}],
        "x": [None, 2.0],
    }


# ----------------------------------------------------------------------------- incomplete sessions
def test_a_failed_session_keeps_the_saved_baseline_and_reports_not_passed(pytester: pytest.Pytester) -> None:
    saved, report = pytester.path / "b.json", pytester.path / "r.json"
    run(pytester, f"--rl-save-baseline={saved}").assert_outcomes(passed=5)
    before = saved.read_text()
    failed = run(
        pytester,
        f"--rl-save-baseline={saved}",
        f"--rl-report={report}",
        "-k",
        "not update_actor",
        last="assert False",
    )
    assert failed.ret == pytest.ExitCode.TESTS_FAILED
    assert saved.read_text() == before
    assert f"baseline not saved to '{saved}': 1 test(s) failed or errored" in failed.stdout.str()
    assert json.loads(report.read_text())["passed"] is False


def test_an_interrupted_session_saves_no_baseline(pytester: pytest.Pytester) -> None:
    saved, report = pytester.path / "b.json", pytester.path / "r.json"
    result = run(
        pytester, f"--rl-save-baseline={saved}", f"--rl-report={report}", last="raise KeyboardInterrupt"
    )
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert not saved.exists()
    assert (
        "baseline not saved" in result.stdout.str() and "the session was interrupted" in result.stdout.str()
    )
    assert json.loads(report.read_text())["passed"] is False


def test_an_errored_setup_also_counts_as_incomplete(pytester: pytest.Pytester) -> None:
    saved = pytester.path / "b.json"
    pytester.makeconftest("import pytest\n@pytest.fixture\ndef broken():\n    raise RuntimeError('no')\n")
    pytester.makepyfile(test_more="def test_uses_broken(broken):\n    pass\n")
    result = run(pytester, f"--rl-save-baseline={saved}")
    result.assert_outcomes(passed=5, errors=1)
    assert not saved.exists()
