"""The plugin's own hook implementations for other frameworks (registered in pytest_configure).

``pytest_rlbench_make_trainer`` builds the adapter that ``--rl-trainer`` names; it runs last, so a
conftest.py's own trainer still wins. ``pytest_generate_tests`` runs every test that uses the
trainer once per framework when ``--rl-trainer`` names several (``fixture.rl_framework``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from pytest_rlbench.frameworks import TRL

if TYPE_CHECKING:
    from pytest_rlbench.session.cluster import ClusterInfo
    from trainer.config import Config

NAME = "rlbench-frameworks"


@pytest.hookimpl(trylast=True)
def pytest_rlbench_make_trainer(
    config: pytest.Config, rl_config: Config, cluster: ClusterInfo, rl_framework: str
) -> Any | None:
    if rl_framework != TRL:
        return None
    from pytest_rlbench.frameworks.trl_adapter import TRLAdapter
    from pytest_rlbench.session.fixtures import get_session

    session = get_session(config)
    return TRLAdapter(rl_config, session.dataset().prompts, session.workdir())


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "rl_framework" not in metafunc.fixturenames:
        return
    from pytest_rlbench.session.fixtures import get_session

    frameworks = get_session(metafunc.config).opts.trainers
    if len(frameworks) > 1:  # session scope: pytest groups the tests by framework, one trainer at a time
        metafunc.parametrize("rl_framework", frameworks, indirect=True, ids=frameworks, scope="session")
