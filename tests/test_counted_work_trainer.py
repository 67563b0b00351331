"""The bundled trainer counts a phase's work in its workers too (GRPOTrainer.count_work through
WorkerGroup.counting and TrainWorker.counted), under dp (the CPU default) and fsdp2 (the GPU
default, here on gloo), and the counts repeat call after call within ``WORK_ALLOWANCE``: what makes
them evidence a gate can compare (``WorkEvidence`` in pytest_rlbench/verdict/judge.py). Real Ray,
tiny preset, CPU."""

from __future__ import annotations

import dataclasses

import pytest
import ray

from pytest_rlbench.verdict.judge import WorkEvidence
from trainer import work_counts
from trainer.build import build_trainer, ray_session
from trainer.config import build_config
from trainer.work_counts import count_work

TOY = [
    "data.synthetic_difficulty=tiny",
    "data.train_batch_size=8",
    "actor_rollout_ref.rollout.n=2",
    "data.max_response_length=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
]


@pytest.fixture(scope="module")
def local_ray():
    with ray_session(num_cpus=2):
        assert ray.is_initialized()
        yield


@pytest.mark.parametrize("strategy", ["dp", "fsdp2"])
def test_the_workers_share_is_counted_and_repeats(local_ray, tmp_path, strategy: str, monkeypatch) -> None:
    # the driver's own share never starts torch's GPU profiler: the workers run the GPU work (on a GPU
    # host the driver's profiler warned in every session and counted nothing)
    profiled: list[str] = []
    real_profiler = work_counts._device_profiler
    monkeypatch.setattr(work_counts, "_device_profiler", lambda: profiled.append("driver") or real_profiler())
    trainer = build_trainer(build_config([*TOY, f"actor_rollout_ref.actor.strategy={strategy}"]), tmp_path)
    try:
        trainer.train_step(next(trainer.loader))  # the batch every phase below reads
        batch, prompts = trainer.last_batch, next(trainer.loader)
        phases = {  # the same prompts and seed every call (no step between): the same responses
            "generate_sequences": lambda: trainer.generate_sequences(prompts),
            "old_log_prob": lambda: trainer.compute_old_log_prob(batch),
            "update_actor": lambda: trainer.update_actor(batch),
        }
        for name, phase in phases.items():
            first, again = trainer.count_work(phase)[1], trainer.count_work(phase)[1]
            assert profiled == [], (name, profiled)
            driver_only = count_work(phase, device=False)[1]  # what this process alone dispatches
            assert WorkEvidence(dataclasses.asdict(again), dataclasses.asdict(first)).same, (
                name,
                first,
                again,
            )
            assert first.ops > driver_only.ops and first.flops > driver_only.flops >= 0, (
                name,
                first,
                driver_only,
            )
        assert trainer.workers.counted is None  # counting ends with the call: later calls run as before
        assert trainer.compute_old_log_prob(batch).shape == batch.response_ids.shape
    finally:
        trainer.shutdown()
