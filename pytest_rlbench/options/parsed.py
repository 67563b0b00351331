"""``RLBenchOptions``: the parsed ``--rl-*`` options, as the session and the fixtures read them.

Built by ``pytest_rlbench.options.parse.parse_options``; the option table is ``options/table.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_rlbench.frameworks import OURS
from pytest_rlbench.options.checks import DEFAULT_MODEL
from pytest_rlbench.options.table import (
    DEFAULT_ROLLOUT,
    DEFAULT_ROUNDS,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WARMUP_ROUNDS,
    PROGRESS_MODES,
    SPECS,
)
from pytest_rlbench.records.record import RunRecord
from pytest_rlbench.verdict.noise import DEFAULT_TOLERANCE
from trainer.config import Override
from trainer.config.schema import TrainerSection


@dataclass(frozen=True)
class RLBenchOptions:
    """The parsed options. Defaults are those of a plain ``pytest suites/`` run.

    gpus_per_node None means "all visible GPUs" (resolved against the cluster at session start);
    ray_address None means an embedded local Ray; dataset None means the synthetic math set."""

    nodes: int = 1
    gpus_per_node: int | None = None
    gpu: bool = False
    ray_address: str | None = None
    ray_address_source: str = "embedded"  # which option or variable gave ray_address
    model: str = DEFAULT_MODEL
    dataset: Path | None = None
    rollout: str = DEFAULT_ROLLOUT  # the trainer's engine: the first --rl-rollout
    rollout_panel: tuple[str, ...] = ()  # the further --rl-rollout engines, compared with it (docs/fidelity.md)
    config_overrides: tuple[str, ...] = ()  # --rl-config as given (ini file's first)
    # What the trainer config is built from: the ini file's rl_config overrides (the suites' default
    # work, which a replayed workload replaces), then the options' and the command line's --rl-config.
    ini_overrides: tuple[Override, ...] = ()
    overrides: tuple[Override, ...] = ()
    baselines: tuple[str, ...] = ()  # --rl-baseline as given (files made absolute)
    workload: str | None = None  # a baseline whose work per GPU the run replays (--rl-workload)
    # Their records, loaded once, here: every later reader (the trainer config, the gates, the reports)
    # takes them from the session instead of reading the files again.
    baseline_records: tuple[RunRecord, ...] = field(default=(), compare=False, repr=False)
    workload_record: RunRecord | None = field(default=None, compare=False, repr=False)
    tolerance: float = DEFAULT_TOLERANCE
    max_mismatch: float | None = None  # --rl-max-mismatch: the limit on token_mult_prob_error
    rounds: int = DEFAULT_ROUNDS
    warmup_rounds: int = DEFAULT_WARMUP_ROUNDS
    report: Path | None = None
    save_baseline: Path | None = None
    ray_timeout: float = DEFAULT_TIMEOUT_S
    phase_timeout: float = TrainerSection.phase_timeout_s
    # The frameworks whose trainers the suites run (--rl-trainer, in order): with several, every test
    # that uses the trainer runs once per framework (ids [ours], [trl]) and each has its own record.
    trainers: tuple[str, ...] = (OURS,)
    progress: str = PROGRESS_MODES[0]  # --rl-progress: auto, on, off
    sources: Mapping[str, str] = field(default_factory=dict)  # dest -> where the value came from

    @property
    def trainer(self) -> str:
        """The first framework: the one whose record is the report's top level and keeps the
        --rl-save-baseline path as given."""
        return self.trainers[0]

    @property
    def embedded(self) -> bool:
        return self.ray_address is None

    def source_of(self, dest: str) -> str:
        """How messages name an option: as the user gave it, else by its flag."""
        return self.sources.get(dest, SPECS[dest].flag if dest in SPECS else dest)

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "gpu": self.gpu,
            "ray_address": self.ray_address,
            "model": self.model,
            "dataset": str(self.dataset) if self.dataset else None,
            "rollout": self.rollout,
            "rollout_panel": list(self.rollout_panel),
            "config_overrides": list(self.config_overrides),
            "baselines": list(self.baselines),
            "workload": self.workload,
            "tolerance": float(self.tolerance),  # a number: what the verdicts apply (the default's too)
            "max_mismatch": self.max_mismatch,
            "rounds": self.rounds,
            "warmup_rounds": self.warmup_rounds,
            "report": str(self.report) if self.report else None,
            "save_baseline": str(self.save_baseline) if self.save_baseline else None,
            "trainer": self.trainer,
            "trainers": list(self.trainers),
        }
