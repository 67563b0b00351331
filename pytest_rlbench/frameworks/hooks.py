"""The plugin's own hook implementations for other frameworks (registered in pytest_configure).

``pytest_rlbench_make_trainer`` builds the adapter that ``--rl-trainer`` names; it runs last, so a
conftest.py's own trainer still wins. ``pytest_runtest_call`` skips a phase benchmark whose trainer
lists the phase in ``absent_phases`` (a phase the framework does not separate is never invented).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from pytest_rlbench.frameworks import TRL

if TYPE_CHECKING:
    from pytest_rlbench.cluster import ClusterInfo
    from trainer.config import Config

NAME = "rlbench-frameworks"


@pytest.hookimpl(trylast=True)
def pytest_rlbench_make_trainer(config: pytest.Config, rl_config: Config, cluster: ClusterInfo) -> Any | None:
    from pytest_rlbench.fixtures import get_session

    session = get_session(config)
    if session.opts.trainer != TRL:
        return None
    from pytest_rlbench.frameworks.trl_adapter import TRLAdapter

    return TRLAdapter(rl_config, session.dataset().prompts, session.workdir())


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    mark = item.get_closest_marker("rl_phase")
    trainer = getattr(item, "funcargs", {}).get("rl_trainer")
    if mark is None or trainer is None:
        return
    reason = getattr(trainer, "absent_phases", {}).get(mark.args[0])
    if reason:
        pytest.skip(reason)
