"""The plugin's hookspecs: registered, documented, and called on a conftest.py that implements them."""

from __future__ import annotations

import inspect
import json
import textwrap

import pytest

from pytest_rlbench import hookspec

pytestmark = pytest.mark.usefixtures("plugin_deps_loaded")  # see tests/conftest.py

HOOKS = [name for name, obj in vars(hookspec).items() if name.startswith("pytest_rlbench_") and callable(obj)]


def test_every_hook_is_typed_and_documented() -> None:
    assert set(HOOKS) >= {
        "pytest_rlbench_baselines",
        "pytest_rlbench_make_trainer",
        "pytest_rlbench_update_report",
        "pytest_rlbench_update_run_record",
        "pytest_rlbench_update_config",
    }
    for name in HOOKS:
        fn = getattr(hookspec, name)
        doc = inspect.getdoc(fn) or ""
        assert "Called" in doc and "conftest.py" in doc, (
            f"{name}: docstring must say when it is called and how to use it"
        )
        params = inspect.signature(fn).parameters
        assert list(params)[0] == "config"
        assert all(p.annotation is not inspect.Parameter.empty for p in params.values()), name
        assert inspect.signature(fn).return_annotation is not inspect.Signature.empty, name


def test_make_trainer_is_firstresult_and_the_others_collect_every_result(pytestconfig: pytest.Config) -> None:
    hooks = pytestconfig.pluginmanager.hook
    assert hooks.pytest_rlbench_make_trainer.spec.opts["firstresult"] is True
    for name in set(HOOKS) - {"pytest_rlbench_make_trainer"}:
        assert not getattr(hooks, name).spec.opts["firstresult"], name


CONFTEST = """
import pytest

class Trainer:
    def __init__(self, cfg, cluster):
        self.cfg, self.cluster = cfg, cluster

def inline_baseline():
    import json
    from pytest_rlbench.records.baselines import resolve_baseline

    data = json.loads(resolve_baseline("rlinf-1.5b").read_text())
    data["name"] = "inline"
    return data

CALLS = []

def pytest_rlbench_baselines(config):
    CALLS.append("baselines")
    return ["verl-v0.5.0-1.5b", inline_baseline()]

def pytest_rlbench_update_config(rl_config):
    rl_config.actor_rollout_ref.rollout.n = 2

@pytest.hookimpl(tryfirst=True)
def pytest_rlbench_make_trainer(rl_config, cluster):
    return None  # declines: the next implementation decides

def pytest_rlbench_update_run_record(record):
    record.setdefault("provenance", {})["commit"] = "abc123"

def pytest_rlbench_update_report(config, report):
    report["site"] = {"rack": "b12", "tolerance": config.getoption("rl_tolerance")}
"""

PLUGIN = """
def pytest_rlbench_make_trainer(rl_config, cluster):
    from conftest import Trainer
    return Trainer(rl_config, cluster)

def pytest_rlbench_baselines():
    return None  # adds nothing
"""

TESTS = """
from pytest_rlbench.session.fixtures import get_session

def test_hooks(request, rl_config):
    config = request.config
    # update_config ran when the session built the trainer config
    assert rl_config.actor_rollout_ref.rollout.n == 2
    # baselines: --rl-baseline first, then the hooks' lists
    from conftest import inline_baseline

    from conftest import CALLS

    names = [r.name for r in get_session(config).baseline_records]
    assert names == ["verl-7b", "verl-v0.5.0-1.5b", inline_baseline()["name"]]
    assert CALLS == ["baselines"]  # once per session, as its docstring says
    trainer = config.hook.pytest_rlbench_make_trainer(
        config=config, rl_config=rl_config, cluster="the-cluster", rl_framework="ours"
    )
    assert type(trainer).__name__ == "Trainer" and trainer.cluster == "the-cluster"
    record = {}
    config.hook.pytest_rlbench_update_run_record(config=config, record=record)
    assert record == {"provenance": {"commit": "abc123"}}
    report = {}
    config.hook.pytest_rlbench_update_report(config=config, report=report)
    assert report == {"site": {"rack": "b12", "tolerance": "0.2"}}
"""


def test_a_conftest_implementing_the_hooks_is_called(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(other_plugin=PLUGIN, test_hooks=TESTS)
    pytester.syspathinsert()
    result = pytester.runpytest("-p", "other_plugin", "--rl-baseline=verl-7b", "--rl-tolerance=0.2")
    result.assert_outcomes(passed=1)


def test_a_misspelled_hook_is_an_error_because_the_specs_are_registered(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("def pytest_rlbench_baseline(config):\n    return []\n")
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest()
    assert result.ret != pytest.ExitCode.OK
    assert "unknown hook 'pytest_rlbench_baseline'" in result.stdout.str() + result.stderr.str()


def test_a_bad_baseline_from_a_hook_ends_the_session_naming_it(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        "def pytest_rlbench_baselines(config):\n"
        "    return [{'format_version': 1, 'name': 'broken', 'phases': {'gen': {'seconds': -1}}}]\n"
    )
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "a baseline from pytest_rlbench_baselines" in err and "$.phases.gen.seconds" in err


def docstring_example(hook: str) -> str:
    """The conftest.py code a hook's docstring shows: the indented block after its last "::"."""
    doc = inspect.getdoc(getattr(hookspec, hook)) or ""
    return textwrap.dedent(doc.rpartition("::")[2]).strip() + "\n"


SLEEP_SUITE = """
import time
import pytest

@pytest.mark.rl_phase("update_actor")
def test_update_actor(rl_bench):
    rl_bench(lambda: time.sleep(0.01))
"""


def test_the_run_record_hook_example_works_on_a_real_record(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The example once wrote record["source"]["commit"]: a KeyError, the record has "provenance".
    monkeypatch.setenv("CI_COMMIT_SHA", "0123456789abcdef")
    pytester.makeconftest(docstring_example("pytest_rlbench_update_run_record"))
    pytester.makepyfile(test_suite=SLEEP_SUITE)
    saved = pytester.path / "run.json"
    result = pytester.runpytest("--rl-rounds=2", "--rl-warmup-rounds=0", f"--rl-save-baseline={saved}")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    assert json.loads(saved.read_text())["provenance"]["commit"] == "0123456789abcdef"


def test_the_report_hook_example_works_on_a_real_report(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(docstring_example("pytest_rlbench_update_report"))
    pytester.makepyfile(test_suite=SLEEP_SUITE)
    report = pytester.path / "r.json"
    result = pytester.runpytest("--rl-rounds=2", "--rl-warmup-rounds=0", f"--rl-report={report}")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    assert json.loads(report.read_text())["site"] == {"rack": "b12"}
