"""The whole training step: each round trains on the next batch of prompts, phase by phase."""

from __future__ import annotations

import pytest

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
    assert set(STEP_PHASES) - {"ref"} <= set(last)
    assert sum(last[k] for k in ("gen", "reward", "old_log_prob", "adv", "update_actor")) <= last["step"]
