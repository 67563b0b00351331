"""Each phase's peak GPU memory in a worker, for the step's figures ``gpu/<figure>/<phase>``.

A phase's peak is what torch's caching allocator saw between the phase's start and its end in this
worker: the tensors held at most (``max_allocated_gib``: what the phase needs, the weights and state
it keeps included) and the memory the allocator took from the driver (``max_reserved_gib``: what
``nvidia-smi`` shows, less the CUDA context). nvidia-smi alone reads the reserved figure, an upper bound
on the need. Nothing on CPU workers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch

GPU = "gpu"  # the step figures' family (the plugin records gpu/* as evidence, never judged)
MAX_ALLOCATED = "max_allocated_gib"
MAX_RESERVED = "max_reserved_gib"
GIB = 2**30


class PhasePeaks:
    """The peaks of the phases a worker ran since they were last taken, in bytes."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peaks: dict[str, tuple[int, int]] = {}  # phase -> (max allocated, max reserved)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.device.type != "cuda":
            yield
            return
        torch.cuda.reset_peak_memory_stats(self.device)  # the peak restarts from what is held now
        try:
            yield
        finally:
            self.peaks[name] = (
                torch.cuda.max_memory_allocated(self.device),
                torch.cuda.max_memory_reserved(self.device),
            )

    def take(self) -> dict[str, tuple[int, int]]:
        taken, self.peaks = self.peaks, {}
        return taken


def memory_figures(per_worker: Sequence[Mapping[str, tuple[int, int]]]) -> dict[str, float]:
    """The step's memory figures from each worker's peaks: per phase, the largest over the workers,
    in GiB (``gpu/max_allocated_gib/update_actor``, ...)."""
    out: dict[str, float] = {}
    for peaks in per_worker:
        for phase, (allocated, reserved) in peaks.items():
            for figure, value in ((MAX_ALLOCATED, allocated), (MAX_RESERVED, reserved)):
                key = f"{GPU}/{figure}/{phase}"
                out[key] = max(out.get(key, 0.0), value / GIB)
    return out
