"""The trainer under test, one framework at a time: the ``rl_framework`` and ``rl_trainer`` fixtures.

With one ``--rl-trainer`` (the default: ours) ``rl_framework`` is that name and the tests keep their
plain ids. With several, the plugin parametrises ``rl_framework`` over them at session scope
(``hooks.pytest_generate_tests``): every test that uses the trainer runs once per framework, with the
framework in its id (``test_step[trl]``), pytest groups the tests by framework and tears one
framework's trainer (and the warm-up batch built on it) down before it builds the next, and each
framework's measurements go to its own recorder (``Recorders.activate``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from pytest_rlbench.frameworks.phase_skips import absent_phases
from pytest_rlbench.frameworks.protocol import OptionalTraits, TrainerUnderTest, missing_members
from pytest_rlbench.session.bench import describe_config, describe_hardware, describe_model, describe_workload
from pytest_rlbench.session.fixtures import SessionUsageError, get_session
from pytest_rlbench.session.recorder import RECORDERS_KEY
from pytest_rlbench.session.resources import RLDataset, RLModel

if TYPE_CHECKING:
    from pytest_rlbench.session.cluster import ClusterInfo
    from trainer.config import Config


@pytest.fixture(scope="session")
def rl_framework(request: pytest.FixtureRequest) -> str:
    """The --rl-trainer name of the framework under test ("ours", "trl"): the test's parameter when
    several were given, else the one framework."""
    return getattr(request, "param", None) or get_session(request.config).opts.trainer


@pytest.fixture(scope="session")
def rl_trainer(
    pytestconfig: pytest.Config,
    rl_framework: str,
    rl_cluster: ClusterInfo,
    rl_config: Config,
    rl_model: RLModel,
    rl_dataset: RLDataset,
) -> Iterator[TrainerUnderTest]:
    """The trainer under test, its workers placed on the cluster: what a ``pytest_rlbench_make_trainer``
    implementation returns for ``rl_framework`` (the plugin's own builds TRL's adapter), else the
    bundled GRPO trainer. Shut down at the end of the session, or before the next framework's."""
    cfg = rl_config  # checkpoints go to the session's temp dir unless the user set the directory
    session = get_session(pytestconfig)
    trainer = pytestconfig.hook.pytest_rlbench_make_trainer(
        config=pytestconfig, rl_config=cfg, cluster=rl_cluster, rl_framework=rl_framework
    )
    if trainer is None:
        from trainer.build import build_trainer

        with session.progress().stage("set-up: starting the trainer's workers"):
            trainer = build_trainer(cfg, session.workdir(), dataset=rl_dataset.prompts)
    missing = missing_members(trainer)
    if missing:
        if hasattr(trainer, "shutdown"):
            trainer.shutdown()
        raise SessionUsageError(
            f"the trainer under test for --rl-trainer {rl_framework} ({type(trainer).__name__}, from "
            f"pytest_rlbench_make_trainer) lacks {', '.join(missing)}; a trainer offers every member of "
            "pytest_rlbench.frameworks.protocol.TrainerUnderTest"
        )
    recorder = pytestconfig.stash[RECORDERS_KEY].activate(rl_framework)
    context = recorder.context
    traits = OptionalTraits.of(trainer)
    recorder.add_setup_figures(list(traits.workers))  # outside every phase: evidence
    context.framework = traits.framework  # an adapter names its own
    context.differences = list(traits.differences)
    context.absent_phases = absent_phases(trainer)
    context.hardware = describe_hardware(rl_cluster, cfg, list(traits.workers))
    context.gpus = [(w["gpu_uuid"], int(w["pid"])) for w in traits.workers if w.get("gpu_uuid") and w.get("pid")]
    context.model = describe_model(rl_model, cfg)
    context.config = describe_config(cfg, *session.rounds())
    context.workload = describe_workload(cfg, context.model)
    try:
        yield trainer
    finally:
        trainer.shutdown()
