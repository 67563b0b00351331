"""Progress on long work (pytest_rlbench/session/progress.py): set-up, warm-up and each round say what runs,
on stderr and outside every test's captured output; quiet when not on a terminal unless asked."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pytest_rlbench.session.progress import Progress, resolve_enabled, round_label

pytestmark = pytest.mark.usefixtures("plugin_deps_loaded")  # see tests/conftest.py

SUITE = """
import pytest

@pytest.mark.rl_phase("adv")
def test_adv(rl_bench):
    print("the test's own output")
    rl_bench(lambda: sum(range(1000)))
    assert False, "fails, to show its captured output"
"""


def test_round_labels_count_warm_up_then_timed_rounds() -> None:
    assert [round_label(i, 1, 3) for i in range(4)] == [
        "warm-up round 1/1", "round 1/3", "round 2/3", "round 3/3"
    ]
    assert round_label(0, 0, 1) == "round 1/1"


@pytest.mark.parametrize(
    ("mode", "terminal", "enabled"),
    [("auto", True, True), ("auto", False, False), ("on", False, True), ("off", True, False)],
)
def test_auto_draws_only_on_a_terminal(mode: str, terminal: bool, enabled: bool) -> None:
    assert resolve_enabled(mode, terminal) is enabled


def test_on_a_terminal_a_bar_is_drawn_below_pytests_line_and_the_cursor_put_back(capsys) -> None:
    writer = SimpleNamespace(width_of_current_line=len("suites/test_phases.py "))
    progress = Progress(enabled=True, terminal=True, reporter=SimpleNamespace(_tw=writer))
    with progress.stage("gen", 2) as stage:
        stage.step("round 1/2")
        stage.done()
    err = capsys.readouterr().err
    assert err.startswith("\n") and "gen: round 1/2" in err
    assert err.endswith("\x1b[A\x1b[23G")  # up one line, to the column after pytest's text


def test_a_disabled_progress_writes_nothing(capsys) -> None:
    with Progress(enabled=False, terminal=True).stage("set-up", 1) as stage:
        stage.step("starting Ray")
        stage.done()
    assert capsys.readouterr() == ("", "")


def test_rounds_are_reported_on_stderr_and_not_in_the_tests_captured_output(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest("--rl-progress=on", "--rl-rounds=3", "--rl-warmup-rounds=1", "-p", "no:randomly")
    result.assert_outcomes(failed=1)
    err, out = result.stderr.str(), result.stdout.str()
    for text in ("set-up: loading the model", "adv: warm-up round 1/1", "adv: round 3/3"):
        assert text in err, f"{text!r} not in {err!r}"
    assert "the test's own output" in out  # the captured stdout is shown with the failure...
    assert "Captured stderr" not in out and "round 1/3" not in out  # ...and holds no progress


def test_auto_is_quiet_when_not_a_terminal(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest("--rl-rounds=2", "-p", "no:randomly")
    result.assert_outcomes(failed=1)
    assert "round 1/2" not in result.stderr.str() + result.stdout.str()


def test_a_bad_progress_mode_is_a_usage_error_naming_the_choices(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SUITE)
    result = pytester.runpytest("--rl-progress=sometimes")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--rl-progress expects one of auto, on, off, got 'sometimes'" in result.stderr.str()

