"""Wall-clock timing of phases under VERL's timing keys, synchronised with the device.

A phase's time is what a user waits for: the device queue is drained before the clock starts and
before it stops, so asynchronous CUDA work is counted in the phase that launched it. A key timed
twice in one step is summed, as VERL's ``marked_timer`` does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def device_synchronize() -> None:
    """Wait for queued device work (no-op on CPU)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def device_clock() -> float:
    """perf_counter after draining the device queue: the one clock every phase time is read from."""
    device_synchronize()
    return time.perf_counter()


class PhaseTimer:
    """Collects phase durations (seconds) for one step, and each phase's last span in wall-clock time
    (``spans``: (start, end) since the epoch, to set beside the workers' own: trainer/workers/phase_spans.py)."""

    def __init__(self, synchronize: bool = True) -> None:
        self.synchronize = synchronize
        self.seconds: dict[str, float] = {}
        self.spans: dict[str, tuple[float, float]] = {}

    @contextmanager
    def phase(self, key: str) -> Iterator[None]:
        clock = device_clock if self.synchronize else time.perf_counter
        start = clock()
        started_at = time.time()
        try:
            yield
        finally:
            self.add(key, clock() - start)
            self.spans[key] = (started_at, time.time())

    def add(self, key: str, seconds: float) -> None:
        self.seconds[key] = self.seconds.get(key, 0.0) + seconds

    def reset(self) -> None:
        self.seconds = {}
        self.spans = {}
