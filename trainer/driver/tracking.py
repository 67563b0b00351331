"""trainer.logger backends: console lines and TensorBoard scalars."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TextIO

from trainer.phases import PHASE_KEYS


def format_console(step: int, metrics: dict[str, float]) -> str:
    """One line per step: VERL's timing_s keys first (verl/trainer/ppo/metric_utils.py
    compute_timing_metrics), in trainer.phases.PHASE_KEYS order, then the rest."""
    timing = [f"timing_s/{k}:{metrics[f'timing_s/{k}']:.3f}" for k in PHASE_KEYS if f"timing_s/{k}" in metrics]
    rest = [f"{k}:{_fmt(v)}" for k, v in sorted(metrics.items()) if not k.startswith("timing_s/")]
    return f"step:{step} - " + " - ".join(timing + rest)


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class Tracking:
    """Sends each step's metrics to every configured backend."""

    def __init__(self, backends: list[str], log_dir: str | Path, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.console = "console" in backends
        self.writer = None
        if "tensorboard" in backends:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:  # tensorboard is an optional extra
                raise RuntimeError(
                    "trainer.logger includes tensorboard but the tensorboard package is not installed; "
                    "pip install 'pytest-rlbench[tensorboard]'"
                ) from exc
            self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.console:
            print(format_console(step, metrics), file=self.stream, flush=True)
        if self.writer is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)):
                    self.writer.add_scalar(key, value, global_step=step)
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
