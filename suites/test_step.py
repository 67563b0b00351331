"""The whole training step: each round trains on the next batch of prompts, phase by phase."""

from __future__ import annotations

import pytest

from pytest_rlbench.frameworks.phase_skips import absent_phases
from trainer.phases import STEP_PHASES


@pytest.mark.rl_phase("step")
def test_step(rl_trainer, rl_bench):
    # Each round trains on the next batch: its throughput counts that batch's own tokens, and its phase
    # breakdown, as VERL logs it, goes into the report beside the benchmarks.
    result = rl_bench(
        lambda: rl_trainer.train_step(next(rl_trainer.loader)),
        tokens=lambda r: r.tokens,
        breakdown=lambda r: r.timing_s,
    )
    last = result.timing_s
    assert set(STEP_PHASES) - set(absent_phases(rl_trainer)) <= set(last)  # what it cannot time aside
    inside = ("gen", "reward", "old_log_prob", "adv", "update_actor")
    assert sum(last.get(k, 0.0) for k in inside) <= last["step"]
