"""The whole training step: each round trains on the next batch of prompts, phase by phase."""

from __future__ import annotations

import pytest

from pytest_rlbench.bench import get_recorder
from trainer.phases import STEP_PHASES


@pytest.mark.rl_phase("step")
def test_step(rl_trainer, rl_batch, rl_bench, pytestconfig):
    results = []

    def step():
        result = rl_trainer.train_step(next(rl_trainer.loader))
        results.append(result)
        return result

    rl_bench(step, tokens=rl_batch.tokens)
    # Each round's own phase breakdown, as VERL logs it, goes into the report beside the benchmarks.
    get_recorder(pytestconfig).step_breakdown.extend(r.timing_s for r in results)
    last = results[-1].timing_s
    assert set(STEP_PHASES) - {"ref"} <= set(last)
    assert sum(last[k] for k in ("gen", "reward", "old_log_prob", "adv", "update_actor")) <= last["step"]
