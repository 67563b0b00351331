"""Prompts ready for rollout, and the seeded, resumable stream of batches a training run draws.

The stream's state (seed, epoch, position) is what a checkpoint stores, so a resumed run sees the
same data order. Like VERL's train dataloader (verl/trainer/ppo/ray_trainer.py, ``drop_last=True``)
the last partial batch of an epoch is dropped, and every epoch is reshuffled.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any


def epoch_order(num_prompts: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """The order prompts are served in one epoch: a seeded Fisher-Yates permutation.

    Built from ``random.Random.random()`` only, the one stream Python promises not to change, so a
    checkpoint taken with one Python version resumes the same order under another."""
    order = list(range(num_prompts))
    if not shuffle:
        return order
    rng = random.Random(f"rlbench-data-order:{seed}:{epoch}")
    for i in range(num_prompts - 1, 0, -1):
        j = min(int(rng.random() * (i + 1)), i)
        order[i], order[j] = order[j], order[i]
    return order


@dataclass(frozen=True)
class PromptRow:
    """One prompt, ready for rollout.

    row: its position in the source; index: extra_info.index (row when absent or not an integer);
    uid: the id GRPO groups this prompt's responses by (unique within the data set); messages: the chat
    messages the ids were templated from (for a framework that applies the chat template itself, e.g.
    TRL)."""

    row: int
    index: int
    uid: str
    input_ids: list[int]
    ground_truth: str
    data_source: str
    truncated: bool = False
    messages: tuple[dict[str, str], ...] = ()


@dataclass(frozen=True)
class PromptBatch:
    """One batch of prompts: the ``step``-th batch of ``epoch``."""

    epoch: int
    step: int
    prompts: list[PromptRow]

    def __len__(self) -> int:
        return len(self.prompts)

    @cached_property  # callers index these per row; build each list once
    def input_ids(self) -> list[list[int]]:
        return [p.input_ids for p in self.prompts]

    @cached_property
    def ground_truths(self) -> list[str]:
        return [p.ground_truth for p in self.prompts]

    @cached_property
    def data_sources(self) -> list[str]:
        return [p.data_source for p in self.prompts]

    @cached_property
    def uids(self) -> list[str]:
        return [p.uid for p in self.prompts]


@dataclass(frozen=True)
class LoaderState:
    """Where a batch stream stands: the next batch is batch ``position`` of ``epoch``.

    batch_size, num_prompts and shuffle are kept so that restoring into a different stream is an
    error rather than a silently different data order."""

    seed: int
    epoch: int = 0
    position: int = 0
    batch_size: int = 1
    num_prompts: int = 0
    shuffle: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoaderState:
        names = {f for f in cls.__dataclass_fields__}
        missing = sorted(names - set(data))
        if missing:
            raise ValueError(f"loader state: expected keys {sorted(names)}, missing {missing}")
        return cls(**{k: data[k] for k in names})


class BatchIterator(Iterator[PromptBatch]):
    """Endless batches of ``start.batch_size`` prompts from ``start`` on, reshuffled each epoch (the
    last partial batch of an epoch is dropped). ``max_epochs`` ends the stream if given.

    ``PromptDataset.batches`` builds one from a batch size and seed; ``load_state_dict`` resumes."""

    def __init__(self, prompts: Sequence[PromptRow], start: LoaderState, max_epochs: int | None = None) -> None:
        batch_size = start.batch_size
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"train_batch_size: expected an integer >= 1, found {batch_size!r}")
        if batch_size > len(prompts):
            raise ValueError(
                f"train_batch_size: expected at most the data set's {len(prompts)} prompts, found {batch_size}"
            )
        if start.num_prompts != len(prompts):
            raise ValueError(f"loader state: num_prompts {start.num_prompts}, but the stream has {len(prompts)}")
        self._prompts = prompts
        self.batch_size = batch_size
        self.max_epochs = max_epochs
        self._state = start
        self._order: list[int] = []
        self._order_epoch = -1

    @property
    def batches_per_epoch(self) -> int:
        return len(self._prompts) // self.batch_size

    @property
    def state(self) -> LoaderState:
        """The state before the next batch; restoring it gives that same batch next."""
        return self._state

    def state_dict(self) -> dict[str, Any]:
        return self._state.to_dict()

    def load_state_dict(self, data: dict[str, Any]) -> None:
        """Resume from ``state_dict()``; raise if it was taken on a different stream."""
        state = LoaderState.from_dict(data)
        mine = self._state
        for name in ("batch_size", "num_prompts", "shuffle"):
            if getattr(state, name) != getattr(mine, name):
                raise ValueError(
                    f"loader state: {name} was {getattr(state, name)!r} when saved, "
                    f"but this stream has {getattr(mine, name)!r}"
                )
        if state.epoch < 0 or not 0 <= state.position < self.batches_per_epoch:
            raise ValueError(
                f"loader state: expected epoch >= 0 and 0 <= position < {self.batches_per_epoch}, "
                f"found epoch {state.epoch}, position {state.position}"
            )
        self._state = state

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> PromptBatch:
        s = self._state
        if self.max_epochs is not None and s.epoch >= self.max_epochs:
            raise StopIteration
        if self._order_epoch != s.epoch:
            self._order = epoch_order(len(self._prompts), s.seed, s.epoch, s.shuffle)
            self._order_epoch = s.epoch
        start = s.position * self.batch_size
        batch = PromptBatch(
            s.epoch, s.position, [self._prompts[i] for i in self._order[start : start + self.batch_size]]
        )
        # Roll over eagerly, so a saved state is always the canonical "next batch" position.
        if s.position + 1 >= self.batches_per_epoch:
            self._state = LoaderState(s.seed, s.epoch + 1, 0, s.batch_size, s.num_prompts, s.shuffle)
        else:
            self._state = LoaderState(s.seed, s.epoch, s.position + 1, s.batch_size, s.num_prompts, s.shuffle)
        return batch
