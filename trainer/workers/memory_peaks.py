"""Each phase's peak GPU memory in a worker, for the step's figures ``gpu/<figure>/<phase>``.

A phase's peak is what torch's caching allocator saw between the phase's start and its end in this
worker: the tensors held at most (``max_allocated_gib``: the weights and state it keeps included; a
lower bound on the need, as fragmentation is not counted) and what the allocator held from the
driver (``max_reserved_gib``: nvidia-smi's reading less the CUDA context and what torch does not
allocate, such as NCCL's buffers; the allocator keeps what it took, so this carries earlier phases').
A step's phases, reshard to update_actor, come back with update_actor's figures, so taking them costs
the step no call of its own. Nothing on CPU workers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch only where a peak is read: the plugin imports the names below without it
    import torch

GPU = "gpu"  # the step figures' family (the plugin records gpu/* as evidence, never judged)
MAX_ALLOCATED = "max_allocated_gib"  # the tensors held at most
MAX_RESERVED = "max_reserved_gib"  # what torch's allocator held from the driver (nvidia-smi's reading)
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
        import torch

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


def worker_figures(peaks: Mapping[str, tuple[int, int]]) -> dict[str, float]:
    """One worker's peaks as step figures, GiB: ``gpu/max_allocated_gib/<phase>`` and
    ``gpu/max_reserved_gib/<phase>``."""
    out: dict[str, float] = {}
    for phase, (allocated, reserved) in peaks.items():
        out[f"{GPU}/{MAX_ALLOCATED}/{phase}"] = allocated / GIB
        out[f"{GPU}/{MAX_RESERVED}/{phase}"] = reserved / GIB
    return out


def largest_worker(per_worker: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The step's memory figures from each worker's (``worker_figures``, among its other figures): per
    phase, both figures of the worker that held the most (allocated), so they describe one GPU."""
    out: dict[str, float] = {}
    prefix = f"{GPU}/{MAX_ALLOCATED}/"
    for figures in per_worker:
        for key, allocated in figures.items():
            if not key.startswith(prefix):
                continue
            if allocated >= out.get(key, -1.0):
                phase = key[len(prefix):]
                out[key] = allocated
                out[f"{GPU}/{MAX_RESERVED}/{phase}"] = figures[f"{GPU}/{MAX_RESERVED}/{phase}"]
    return out
