"""The contract of a trainer under test: what the suites and the plugin call on it.

The bundled ``trainer.driver.grpo_trainer.GRPOTrainer`` satisfies it, and so must what a
``pytest_rlbench_make_trainer`` hook returns (TRL's adapter, ``frameworks/trl_adapter.py``, or a
user's trainer). The ``rl_trainer`` fixture checks a trainer against it when it is made, so a missing
method is one start-up message naming it instead of an ``AttributeError`` in the middle of a phase.

Some traits are optional, with defaults (``OptionalTraits``): ``framework`` (the record's
``provenance.framework``), ``differences`` (settings the trainer could not take as configured),
``absent_phases`` (phase key -> why it has no time of its own; ``frameworks/phase_skips.py``) and
``workers.info`` (each worker's own view of its device, which names the GPU exactly).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pytest_rlbench.frameworks import OURS_LABEL

if TYPE_CHECKING:
    import torch

    from trainer.batch import Batch
    from trainer.config import Config
    from trainer.data.loader import PromptBatch
    from trainer.driver.grpo_trainer import StepResult
    from trainer.driver.step_figures import BatchTokens


@runtime_checkable
class TrainerUnderTest(Protocol):
    """A trainer the phase benchmarks drive, one method per VERL phase key."""

    cfg: Config  # the trainer config it runs (the session's)
    loader: Iterator[PromptBatch]  # the training prompts, a step's batch at a time
    last_batch: Batch | None  # the batch of the last ``train_step``: every phase's inputs filled in
    uses_ref: bool  # whether it runs a reference model (False: ``ref`` is absent)

    def train_step(self, prompts: PromptBatch) -> StepResult: ...
    def generate_sequences(self, prompts: PromptBatch) -> Batch: ...
    def reshard(self) -> None: ...
    def compute_reward(self, batch: Batch) -> Batch: ...
    def compute_old_log_prob(self, batch: Batch) -> torch.Tensor: ...
    def compute_ref_log_prob(self, batch: Batch) -> torch.Tensor: ...
    def compute_advantage(self, batch: Batch) -> tuple[Batch, dict[str, float]]: ...
    def update_actor(self, batch: Batch) -> dict[str, float]: ...
    def save_checkpoint(self) -> Path: ...
    def batch_tokens(self, batch: Batch) -> BatchTokens: ...
    def shutdown(self) -> None: ...


@dataclass(frozen=True)
class OptionalTraits:
    """What a trainer may say of itself, read once where it is made (defaults: the bundled trainer's)."""

    framework: str = OURS_LABEL
    differences: Sequence[str] = ()
    absent_phases: Mapping[str, str] = field(default_factory=dict)
    workers: Sequence[Mapping[str, Any]] = ()  # trainer.workers.info: one dict per worker

    @classmethod
    def of(cls, trainer: Any) -> OptionalTraits:
        defaults = cls()
        return cls(
            framework=getattr(trainer, "framework", defaults.framework),
            differences=tuple(getattr(trainer, "differences", None) or ()),
            absent_phases=dict(getattr(trainer, "absent_phases", None) or {}),
            workers=tuple(getattr(getattr(trainer, "workers", None), "info", None) or ()),
        )


# The phase key each phase method times: a trainer may lack the method of a phase it declares absent
# (TRL computes advantages inline: no compute_advantage).
PHASE_OF_METHOD: dict[str, str] = {
    "generate_sequences": "generate_sequences",
    "reshard": "reshard",
    "compute_reward": "reward",
    "compute_old_log_prob": "old_log_prob",
    "compute_ref_log_prob": "ref",
    "compute_advantage": "adv",
    "update_actor": "update_actor",
    "save_checkpoint": "save_checkpoint",
}


def missing_members(trainer: object) -> list[str]:
    """The members of ``TrainerUnderTest`` that ``trainer`` lacks (empty: it satisfies the contract),
    leaving out the methods of the phases it declares absent."""
    members = [*TrainerUnderTest.__annotations__, *(n for n in vars(TrainerUnderTest) if not n.startswith("_"))]
    absent = OptionalTraits.of(trainer).absent_phases
    return [
        name
        for name in dict.fromkeys(members)
        if not hasattr(trainer, name) and PHASE_OF_METHOD.get(name) not in absent
    ]
