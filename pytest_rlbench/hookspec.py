"""Hooks that other plugins and conftest.py files implement to extend a benchmark session.

The plugin registers these with ``pluginmanager.add_hookspecs`` in ``pytest_addhooks``. Implement a
hook by defining a function of the same name in a ``conftest.py`` or a plugin; pytest passes only
the arguments a function names, so ``def pytest_rlbench_baselines(config): ...`` is a valid
implementation. As in pytest-benchmark, a ``firstresult`` hook that makes a thing pairs with a hook
that updates it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import pytest

    from pytest_rlbench.session.cluster import ClusterInfo
    from trainer.config import Config

hookspec = pluggy.HookspecMarker("pytest")


@hookspec
def pytest_rlbench_baselines(config: pytest.Config) -> list[str | Path | dict[str, Any]] | None:
    """Add baselines to compare this run with.

    Called once per session, when the session first needs its baselines (after the options are
    parsed, before any comparison). Every implementation is called; the lists they return are
    appended, in plugin order, to the baselines given with ``--rl-baseline``. Each entry is a stored
    baseline's name, the path of a baseline file, or a baseline record as a dict (the baseline
    file's format). Return None or an empty list to add nothing.

    :param config: The pytest config object.

    Use it in a conftest.py to compare every run of a directory with a team's own reference::

        def pytest_rlbench_baselines(config):
            return [Path(__file__).parent / "baselines" / "h100-nightly.json"]
    """


@hookspec
def pytest_rlbench_update_config(config: pytest.Config, rl_config: Config) -> None:
    """Change the trainer config before the session uses it.

    Called once per session, when the ``rl_config`` fixture's value is built (at the latest before
    the first test that uses it, usually during the start-up checks): after the ``--rl-*`` options and
    ``--rl-config`` overrides are applied, before the config is validated again and handed to
    fixtures and to ``pytest_rlbench_make_trainer``. Change ``rl_config`` in place; the return
    value is ignored. A change that makes the config invalid ends the session with the trainer's
    message.

    :param config: The pytest config object.
    :param rl_config: The trainer's ``trainer.config.Config``, to modify in place.

    Use it in a conftest.py to pin settings for one suite::

        def pytest_rlbench_update_config(rl_config):
            rl_config.actor_rollout_ref.rollout.n = 8
    """


@hookspec(firstresult=True)
def pytest_rlbench_make_trainer(
    config: pytest.Config, rl_config: Config, cluster: ClusterInfo, rl_framework: str
) -> Any | None:
    """Make the trainer under test, replacing the bundled GRPO trainer.

    Called by the ``rl_trainer`` fixture, once per session and framework (``--rl-trainer``; once
    for each when several are given), when a test first asks for the trainer;
    Ray is connected and the cluster has passed the start-up checks. Stops at the first
    implementation that returns something other than None (``firstresult``); that object is the
    trainer the phase benchmarks drive, so it must offer the bundled trainer's phase methods. Return
    None to leave the choice to the next implementation, and in the end to the bundled trainer. The
    plugin's own implementation runs last and builds the adapter ``--rl-trainer`` names
    (``pytest_rlbench/frameworks``).

    Optional attributes of the trainer: ``framework`` (the record's ``provenance.framework``, e.g.
    "trl 1.16.0"), ``differences`` (settings it could not take as configured, listed in the record and
    the report), and ``absent_phases`` (phase key -> reason: those benchmarks are skipped with it and
    the report says "absent"; pytest_rlbench/frameworks/phase_skips.py).

    :param config: The pytest config object.
    :param rl_config: The trainer config built from the options.
    :param cluster: What the cluster has (address, nodes, GPUs).
    :param rl_framework: The ``--rl-trainer`` name being built ("ours", "trl").

    Use it in a conftest.py to benchmark your own trainer against the same baselines::

        def pytest_rlbench_make_trainer(rl_config, cluster):
            return MyTrainer(rl_config)
    """


@hookspec
def pytest_rlbench_update_run_record(config: pytest.Config, record: dict[str, Any]) -> None:
    """Add to a run's record before it is saved as a baseline or compared.

    Called once per session and framework (``--rl-trainer``), after the last benchmark, with the record of this run (the baseline
    file's format: provenance, hardware, model, configuration, per-phase measurements). Change
    ``record`` in place, for example to add provenance the plugin cannot know; the return value is
    ignored. The record is then compared with the baselines and, with ``--rl-save-baseline``, saved.

    :param config: The pytest config object.
    :param record: This run's record, to modify in place.

    Use it in a conftest.py to record the commit a CI job built (the record's sections are those of
    ``pytest_rlbench.records.record.RunRecord``: the commit lives under "provenance")::

        import os

        def pytest_rlbench_update_run_record(record):
            record["provenance"]["commit"] = os.environ["CI_COMMIT_SHA"]
    """


@hookspec
def pytest_rlbench_update_report(config: pytest.Config, report: dict[str, Any]) -> None:
    """Add to the JSON report before it is written.

    Called once per session, at the end, only with ``--rl-report``, with the report as a dict of
    JSON-serialisable values. Change ``report`` in place (add keys under a name of your own); the
    return value is ignored.

    :param config: The pytest config object.
    :param report: The report, to modify in place.

    Use it in a conftest.py to attach your cluster's own inventory::

        def pytest_rlbench_update_report(report):
            report["site"] = {"rack": "b12"}
    """
