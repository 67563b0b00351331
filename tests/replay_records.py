"""Run records of replays of a stored baseline, built the way a session builds them: the baseline's
workload applied to a trainer config (``workload_overrides``), the run's workload read back from that
config (``run_workload``), and phase times scaled from the baseline's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pytest_rlbench.records.record import Hardware, PhaseRecord, Provenance, RunRecord
from pytest_rlbench.records.workload import run_workload, workload_tokens
from pytest_rlbench.records.workload_replay import workload_overrides
from pytest_rlbench.session.bench import describe_config
from trainer.config import Config, Override, apply_override

H100 = "NVIDIA H100 80GB HBM3"
H200 = "NVIDIA H200"


def replay_config(baseline: RunRecord, world_size: int, overrides: Sequence[str] = ()) -> Config:
    """A default trainer config with the baseline's workload applied for ``world_size`` GPUs, then
    ``overrides`` (KEY=VALUE, as --rl-config gives them)."""
    cfg = Config()
    for setting in workload_overrides(baseline, world_size):
        apply_override(cfg, Override(setting.key, setting.value, setting.why))
    for item in overrides:
        apply_override(cfg, item)
    return cfg


def replay_record(
    baseline: RunRecord,
    gpu_model: str | None = H100,
    world_size: int = 1,
    speedup: float = 2.0,
    name: str = "replay",
    overrides: Sequence[str] = (),
) -> RunRecord:
    """A run that replayed ``baseline`` per GPU on ``world_size`` GPUs, each phase ``speedup`` x faster.

    Its token counts are the expected lengths of its own workload (as measured lengths would be, up to
    the draw). ``gpu_model`` None: a CPU run."""
    cfg = replay_config(baseline, world_size, overrides)
    from trainer.rollout.tensor_parallel import decode_group_size

    workload = run_workload(cfg, baseline.model, world_size, rollout_tp=decode_group_size(cfg))
    if gpu_model is None:
        hardware = Hardware("cpu", 1, world_size, 0, None, "x86_64", 16)
    else:
        hardware = Hardware("gpu", 1, world_size, world_size, gpu_model)
    phases = {k: PhaseRecord([s / speedup for s in p.seconds]) for k, p in baseline.phases.items()}
    run = RunRecord(
        name, Provenance("pytest-rlbench test"), hardware, baseline.model, describe_config(cfg), phases=phases
    )
    run = dataclasses.replace(run, workload=workload)
    return dataclasses.replace(run, tokens=workload_tokens(run))
