"""A session's own workload: recorded exactly (every value published) in the run record, saved with it
as a baseline, replayed from it, and gated as before on the same machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_rlbench.records.record import Hardware, ModelArch, TokenCounts, load_record, save_record
from pytest_rlbench.records.workload import workload_matches
from pytest_rlbench.records.workload_format import PUBLISHED, sourced_items
from pytest_rlbench.records.workload_replay import TARGET_LENGTHS, workload_overrides
from pytest_rlbench.session.bench import describe_config, describe_workload
from pytest_rlbench.session.recorder import BenchRecorder
from pytest_rlbench.verdict.compare import compare
from pytest_rlbench.verdict.gate_basis import PER_GPU, SAME_MACHINE
from trainer.config import Config
from trainer.models.presets import arch_from_config, preset_config

# The tiny preset's own numbers, so that a replay finds the preset again.
TINY = ModelArch(name="tiny", dtype="float32", **arch_from_config(preset_config("tiny")).to_dict())


def session_record(tmp_path: Path, cfg: Config, world_size: int, seconds: float, gpus: int = 0):
    """A record as a session builds it: the fixtures describe the run, rl_bench records the rounds."""
    recorder = BenchRecorder(f"run-{world_size}", tmp_path)
    cfg.trainer.n_gpus_per_node = world_size
    if gpus:
        recorder.context.hardware = Hardware("gpu", 1, world_size, world_size, "NVIDIA H100 80GB HBM3")
    else:
        recorder.context.hardware = Hardware("cpu", 1, world_size, 0, cpu_model="x86_64", cpus_per_node=16)
    recorder.context.model = TINY
    recorder.context.config = describe_config(cfg)
    recorder.context.workload = describe_workload(cfg, TINY)
    n = cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n
    recorder.context.tokens = TokenCounts(prompt_lengths=[16] * n, response_lengths=[32] * n, decode_steps=32)
    for phase in ("gen", "update_actor", "step"):
        # five rounds a side: enough for the rank test to reach its level (two could only be inconclusive)
        recorder.record(phase, [seconds * (1 + i / 100) for i in range(5)], f"t::{phase}")
    return recorder.build_record()


def ignore_eos_config() -> Config:
    cfg = Config()
    cfg.actor_rollout_ref.rollout.ignore_eos = True  # every response at the cap: known work
    cfg.data.max_response_length = 32
    cfg.data.synthetic_prompt_length = 16  # the key the length helper adds; read with a default
    return cfg


def test_a_run_records_its_own_workload_exactly_and_saves_it(tmp_path: Path) -> None:
    cfg = ignore_eos_config()
    run = session_record(tmp_path, cfg, 1, 1.0)
    assert run.workload is not None
    assert all(item.source == PUBLISHED for _, item in sourced_items(run.workload))
    w = run.workload
    assert (w.sequences_per_step.value, w.sequences_per_gpu.value, w.samples_per_prompt.value) == (32, 32, 4)
    assert (w.response_length.shape.value, w.response_length.mean.value, w.response_length.max.value) == (
        "constant",
        32.0,
        32,
    )
    assert (w.prompt_length.shape.value, w.prompt_length.mean.value) == ("constant", 16.0)
    saved = load_record(save_record(run, tmp_path / "saved.json"))
    assert saved.workload == run.workload


def test_a_saved_baseline_replays_to_the_same_settings_and_gates(tmp_path: Path) -> None:
    cfg = ignore_eos_config()
    saved = load_record(save_record(session_record(tmp_path, cfg, 1, 1.0), tmp_path / "saved.json"))
    settings = {s.key: s.value for s in workload_overrides(saved, 1)}
    assert settings["data.train_batch_size"] == cfg.data.train_batch_size
    assert settings["actor_rollout_ref.rollout.n"] == cfg.actor_rollout_ref.rollout.n
    assert settings["actor_rollout_ref.rollout.ignore_eos"] is True  # constant at the cap is ignore_eos
    assert settings[f"{TARGET_LENGTHS}.distribution"] == "none"
    assert settings["data.synthetic_prompt_length"] == 16
    assert settings["actor_rollout_ref.model.path"] == "tiny"
    # the same machine: gated as before, on times and throughputs
    again = compare(session_record(tmp_path, cfg, 1, 1.05), saved)
    assert (again.mode, again.basis, again.passed) == ("gate", SAME_MACHINE, True)
    slower = compare(session_record(tmp_path, cfg, 1, 1.5), saved)
    assert not slower.passed and {c.metric for c in slower.failures} == {"timing_s/gen", "timing_s/update_actor"}
    # step is paced by the two phases inside it, which slowed alike (pytest_rlbench.verdict.session_pace)
    assert {c.reason for c in slower.comparisons if c.metric == "timing_s/step"} == {"session slower"}


def test_natural_lengths_are_never_a_per_gpu_gate(tmp_path: Path) -> None:
    cfg = Config()  # the model's own response lengths: the work is not known in advance
    one = session_record(tmp_path, cfg, 1, 1.0, gpus=1)
    cfg2 = Config()
    cfg2.data.train_batch_size = 16  # twice the sequences on two GPUs: the same count per GPU
    two = session_record(tmp_path, cfg2, 2, 1.0, gpus=2)
    assert any("natural" in d for d in workload_matches(two, one))
    assert compare(two, one).mode == "reference"
    known = ignore_eos_config()
    known2 = ignore_eos_config()
    known2.data.train_batch_size = 16
    base = session_record(tmp_path, known, 1, 1.0, gpus=1)
    result = compare(session_record(tmp_path, known2, 2, 1.0, gpus=2), base)
    assert result.mismatches == ("workload.ppo_mini_batches: run 2, baseline 1",)
    known2.actor_rollout_ref.actor.ppo_mini_batch_size = 16  # as a replay sets it: one mini-batch a step
    result = compare(session_record(tmp_path, known2, 2, 1.0, gpus=2), base)
    assert (result.mode, result.basis) == ("gate", PER_GPU)


@pytest.mark.parametrize("world_size", [1, 2])
def test_run_workload_counts_sequences_per_gpu(tmp_path: Path, world_size: int) -> None:
    run = session_record(tmp_path, ignore_eos_config(), world_size, 1.0)
    assert run.workload.sequences_per_gpu.value * world_size == run.workload.sequences_per_step.value
