"""The rollout panel: every --rl-rollout engine on the same prompts, seed and weights, side by side.

``pytest suites/ --rl-rollout hf --rl-rollout static`` trains with hf (the ``gen`` phase's figures are
its) and times each engine here: one test per engine, its tokens/s and its rollout fidelity against
the trainer's old_log_prob recorded under rollout_panel/<engine>/... (pytest_rlbench/session/rollout_panel.py);
the terminal report lists them in one table. With a single engine there is nothing to compare: skipped.
"""

from __future__ import annotations

import pytest

from pytest_rlbench.session.bench import get_recorder
from pytest_rlbench.session.fixtures import get_session
from pytest_rlbench.session.rollout_panel import (
    batch_fidelity,
    engine_round,
    record_panel_engine,
    time_rounds,
)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "rollout_engine" in metafunc.fixturenames:
        opts = get_session(metafunc.config).opts
        engines = (opts.rollout, *opts.rollout_panel)
        # skipped at collection: a lone engine builds no trainer for a panel of one
        alone = pytest.mark.skip(
            reason=f"the rollout panel compares engines and only {opts.rollout} was given: repeat --rl-rollout "
            f"(e.g. --rl-rollout {opts.rollout} --rl-rollout static)"
        )
        marks = () if opts.rollout_panel else (alone,)
        metafunc.parametrize("rollout_engine", [pytest.param(e, marks=marks, id=e) for e in engines])


@pytest.mark.rl_phase("gen")
def test_rollout_panel(pytestconfig, rl_trainer, rl_prompts, rollout_engine):
    """VERL's gen (the weights into the engine, then rollout.n responses per prompt) by one engine."""
    session = get_session(pytestconfig)
    opts = session.opts
    if not hasattr(rl_trainer, "generate_with"):
        pytest.skip(f"{type(rl_trainer).__name__} cannot roll out with another engine (no generate_with)")
    seconds, batch = time_rounds(
        engine_round(rl_trainer, rollout_engine, rl_prompts),
        max(1, opts.warmup_rounds),  # the first call builds a panel engine: never timed
        opts.rounds,
        session.progress(),
        f"rollout panel: {rollout_engine}",
    )
    assert batch.size == len(rl_prompts) * rl_trainer.cfg.actor_rollout_ref.rollout.n
    response_tokens = int(batch.response_lengths.sum())
    figures = record_panel_engine(
        get_recorder(pytestconfig), rollout_engine, seconds, response_tokens, batch_fidelity(rl_trainer, batch)
    )
    assert figures["tokens_per_s"] > 0
