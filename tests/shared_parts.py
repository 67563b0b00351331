"""What many tests build alike: the parts of a tiny model's run record, and a suite of two phases
that time nothing (pytester sessions of the plugin's own plumbing)."""

from __future__ import annotations

from typing import Any

# A two-layer model of a hundred tokens: records of it are cheap to make and compare like any other.
TINY_MODEL: dict[str, Any] = {
    "name": "tiny",
    "num_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 16,
    "vocab_size": 100,
}
# Its work: 2 prompts x 2 responses, prompts of at most 8 tokens and responses of at most 16.
TINY_CONFIG: dict[str, Any] = {
    "train_batch_size": 2,
    "rollout_n": 2,
    "max_prompt_length": 8,
    "max_response_length": 16,
}
CPU_HARDWARE: dict[str, Any] = {
    "device": "cpu",
    "nodes": 1,
    "world_size": 2,
    "cpu_model": "x86_64",
    "cpus_per_node": 16,
}

# Two benchmarks of phases that do nothing: the plugin's bookkeeping, with nothing of the trainer.
TWO_PHASE_SUITE = """
import pytest

@pytest.mark.rl_phase("old_log_prob")
def test_old_log_prob(rl_bench):
    rl_bench(lambda: None)

@pytest.mark.rl_phase("update_actor")
def test_update_actor(rl_bench):
    rl_bench(lambda: None)
"""


def tiny_record(name: str, hardware: dict[str, Any], phases: dict[str, Any], **sections: Any) -> dict[str, Any]:
    """A run record's data of the tiny model (fresh dicts each call): ``sections`` add or replace any
    other section (provenance, tokens, ...)."""
    return {
        "format_version": 1,
        "name": name,
        "provenance": {"source": "pytest-rlbench run", "date": "2026-11-21"},
        "hardware": dict(hardware),
        "model": dict(TINY_MODEL),
        "config": dict(TINY_CONFIG),
        "tokens": {"prompt_lengths": [4, 4, 4, 4], "response_lengths": [10, 12, 14, 16]},
        "phases": phases,
        **sections,
    }


def step_recorder(name: str, directory: Any):
    """A BenchRecorder of a one-worker CPU run of a 1-layer model, with five rounds of 1 s whole steps
    recorded: the record that tests of the figures recorded beside the phases add to."""
    from pytest_rlbench.records.record import Hardware, ModelArch, RunConfig, TokenCounts
    from pytest_rlbench.session.recorder import BenchRecorder

    recorder = BenchRecorder(name, directory)
    recorder.context.hardware = Hardware("cpu", 1, 1, 0, cpu_model="x86", cpus_per_node=2)
    recorder.context.model = ModelArch(
        name="tiny", num_layers=1, hidden_size=2, intermediate_size=4, num_heads=1, num_kv_heads=1, head_dim=2, vocab_size=3
    )
    recorder.context.config = RunConfig(train_batch_size=1, rollout_n=2, max_prompt_length=4, max_response_length=4)
    recorder.context.tokens = TokenCounts(prompt_lengths=[2, 2], response_lengths=[1, 3])
    recorder.record("step", [1.0] * 5, "t::step")
    return recorder


def assert_judged_none_of(run: Any, baseline: Any, family: str) -> None:
    """The run's gate against ``baseline`` passes and compares none of the ``family`` figures, which
    differ between the two: evidence beside the verdicts, never judged."""
    from pytest_rlbench.verdict.compare import compare

    result = compare(run, baseline)
    assert result.mode == "gate" and result.passed, result.failures
    assert not [c for c in result.comparisons if c.metric.startswith(f"{family}/")], result.comparisons
