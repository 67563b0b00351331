"""Counted work: the ATen ops a call dispatched and the FLOPs they stand for, on any device.

A phase's time moves with the machine; the work it dispatches does not. ``count_work(fn)`` runs ``fn``
once under two dispatch modes: ``OpCounter`` (every ATen op that reached the dispatcher, whichever
device runs it, collectives included) and torch's ``FlopCounterMode`` (the FLOPs of the ops it has a
formula for: matmuls, convolutions, attention). Both see what was dispatched, not how fast a kernel
ran: a slower kernel doing the same work counts the same.

The driver counts its own process; each worker counts its share when the driver asks
(``trainer.driver.worker_group.WorkerGroup.counting``) and the shares are summed (``WorkCounts.__add__``).
Counting slows the call (a Python call per op), so a counted call is never a timed one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

T = TypeVar("T")


@dataclass(frozen=True)
class WorkCounts:
    """What one call dispatched: ATen ops and the FLOPs torch has formulas for."""

    ops: int = 0
    flops: int = 0

    def __add__(self, other: WorkCounts) -> WorkCounts:
        return WorkCounts(self.ops + other.ops, self.flops + other.flops)


class OpCounter(TorchDispatchMode):
    """Counts every ATen op dispatched while active (one per call of an op overload)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.ops += 1
        return func(*args, **(kwargs or {}))


def count_work(fn: Callable[[], T]) -> tuple[T, WorkCounts]:
    """``fn()``'s result and the work it dispatched in this process."""
    flops = FlopCounterMode(display=False)
    ops = OpCounter()
    with flops, ops:  # the op counter innermost: it sees each op as the caller dispatched it
        result = fn()
    return result, WorkCounts(ops.ops, int(flops.get_total_flops()))
