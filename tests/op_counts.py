"""A dispatch-level op counter for tests: which ATen ops really ran (an output that selective
checkpointing hands back from the forward is not run again, so it is not counted)."""

from __future__ import annotations

import collections

from torch.utils._python_dispatch import TorchDispatchMode


class OpCounter(TorchDispatchMode):
    """Counts every ATen op dispatched while active, by op packet (``torch.ops.aten.mm``, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket] += 1
        return func(*args, **(kwargs or {}))

    def total(self, packets) -> int:
        return sum(self.counts[p] for p in packets)
