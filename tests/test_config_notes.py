"""A VERL key that changes nothing here is named in the session's summary when a run sets it; so is
a session without warm-up rounds, whose figures include each phase's one-time costs."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("plugin_deps_loaded")  # see tests/conftest.py

SUITE = """
import pytest

@pytest.mark.rl_phase("adv")
def test_adv(rl_bench):
    rl_bench(lambda: None)
"""


def test_the_summary_names_a_set_key_that_has_no_effect(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    args = ("--rl-rounds=1", "--rl-warmup-rounds=0", "-p", "no:randomly")
    quiet = pytester.runpytest(*args)
    assert quiet.ret == pytest.ExitCode.OK, quiet.stdout.str()
    assert "has no effect" not in quiet.stdout.str()
    told = pytester.runpytest(*args, "--rl-config", "trainer.test_freq=5")
    assert told.ret == pytest.ExitCode.OK, told.stdout.str()
    told.stdout.fnmatch_lines(["rlbench: trainer.test_freq=5 has no effect here: *validation is not run*"])


def test_the_summary_says_when_the_timed_rounds_include_first_calls(pytester: pytest.Pytester) -> None:
    import json

    pytester.makepyfile(test_suite=SUITE)
    cold = pytester.runpytest("--rl-rounds=1", "--rl-warmup-rounds=0", "--rl-report=cold.json", "-p", "no:randomly")
    assert cold.ret == pytest.ExitCode.OK, cold.stdout.str()
    cold.stdout.fnmatch_lines(["rlbench: --rl-warmup-rounds 0: each phase's timed rounds start with its first call*"])
    settings = json.loads((pytester.path / "cold.json").read_text())["run"]["config"]["settings"]
    assert (settings["rounds"], settings["warmup_rounds"]) == (1, 0)  # the record says so too
    warm = pytester.runpytest("--rl-rounds=1", "--rl-warmup-rounds=1", "-p", "no:randomly")
    assert warm.ret == pytest.ExitCode.OK, warm.stdout.str()
    assert "first call" not in warm.stdout.str()
    # --benchmark-disable runs each phase once, untimed by pytest-benchmark: one first call, recorded so
    off = pytester.runpytest("--rl-warmup-rounds=1", "--benchmark-disable", "--rl-report=off.json", "-p", "no:randomly")
    assert off.ret == pytest.ExitCode.OK, off.stdout.str()
    off.stdout.fnmatch_lines(["rlbench: --benchmark-disable: each phase's timed rounds start with its first call*"])
    settings = json.loads((pytester.path / "off.json").read_text())["run"]["config"]["settings"]
    assert (settings["rounds"], settings["warmup_rounds"]) == (1, 0)
