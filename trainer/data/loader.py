"""Load a VERL-schema data set into token ids ready for rollout, and serve it in seeded batches.

The steps, in VERL's order: validate every row (validate.py), apply the tokenizer's chat template
with ``add_generation_prompt=True``, tokenize, drop overlong prompts if ``filter_overlong_prompts``,
then apply ``truncation`` ("error", "left", "right", "middle") to what is still too long. Every check
runs before anything is returned: a data set loads whole or raises.

``PromptDataset.batches`` gives an endless, seeded, shuffled stream of ``train_batch_size`` prompts
whose state (seed, epoch, position) a checkpoint stores, so a resumed run sees the same data order.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from trainer.data.validate import (
    DatasetError,
    Problem,
    Source,
    describe_value,
    read_valid_rows,
    source_name,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

TRUNCATION_MODES: tuple[str, ...] = ("error", "left", "right", "middle")
SHOWN_ROWS = 5  # how many overlong rows an error spells out


class PromptTooLongError(ValueError):
    """A prompt is longer than max_prompt_length and truncation is "error"."""


# ----------------------------------------------------------------------------- pure token-list helpers
def check_truncation(mode: str) -> str:
    """Return ``mode`` if it is a truncation mode, else raise naming the valid ones."""
    if mode not in TRUNCATION_MODES:
        raise ValueError(f"truncation: expected one of {', '.join(TRUNCATION_MODES)}, found {mode!r}")
    return mode


def _check_max_length(max_length: int) -> None:
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_prompt_length: expected an integer >= 1, found {max_length!r}")


def truncate_ids(ids: Sequence[int], max_length: int, mode: str = "error") -> list[int]:
    """At most ``max_length`` ids: "left" keeps the last ones, "right" the first ones, "middle" the
    first ``max_length // 2`` and the last ``max_length - max_length // 2`` (VERL's split); "error"
    raises ``PromptTooLongError`` when the list is too long. A short enough list comes back whole."""
    check_truncation(mode)
    _check_max_length(max_length)
    ids = list(ids)
    if len(ids) <= max_length:
        return ids
    if mode == "error":
        raise PromptTooLongError(f"prompt of {len(ids)} tokens is longer than max_prompt_length {max_length}")
    if mode == "left":
        return ids[-max_length:]
    if mode == "right":
        return ids[:max_length]
    head = max_length // 2
    tail = max_length - head
    return ids[:head] + ids[len(ids) - tail :]


def overlong_indices(lengths: Sequence[int], max_length: int) -> list[int]:
    """Positions whose length exceeds ``max_length`` (the rows filter_overlong_prompts drops)."""
    _check_max_length(max_length)
    return [i for i, n in enumerate(lengths) if n > max_length]


def filter_overlong(token_ids: Sequence[Sequence[int]], max_length: int) -> tuple[list[int], list[int]]:
    """Split positions into (kept, dropped): dropped are exactly those longer than ``max_length``."""
    dropped = overlong_indices([len(ids) for ids in token_ids], max_length)
    gone = set(dropped)
    return [i for i in range(len(token_ids)) if i not in gone], dropped


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


# ----------------------------------------------------------------------------- the loaded data set
@dataclass(frozen=True)
class PromptRow:
    """One prompt, ready for rollout.

    row: its position in the source; index: extra_info.index (row when absent); uid: the id GRPO
    groups this prompt's responses by (unique within the data set)."""

    row: int
    index: int
    uid: str
    input_ids: list[int]
    ground_truth: str
    data_source: str
    truncated: bool = False


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
    """Endless batches of ``batch_size`` prompts, reshuffled each epoch (the last partial batch of an
    epoch is dropped, as VERL's train dataloader does). ``max_epochs`` ends the stream if given."""

    def __init__(
        self,
        prompts: Sequence[PromptRow],
        batch_size: int,
        seed: int = 1,
        *,
        shuffle: bool = True,
        max_epochs: int | None = None,
        state: LoaderState | dict[str, Any] | None = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"train_batch_size: expected an integer >= 1, found {batch_size!r}")
        if batch_size > len(prompts):
            raise ValueError(
                f"train_batch_size: expected at most the data set's {len(prompts)} prompts, found {batch_size}"
            )
        self._prompts = prompts
        self.batch_size = batch_size
        self.max_epochs = max_epochs
        self._state = LoaderState(seed, 0, 0, batch_size, len(prompts), shuffle)
        self._order: list[int] = []
        self._order_epoch = -1
        if state is not None:
            self.load_state_dict(state if isinstance(state, dict) else state.to_dict())

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


@dataclass
class PromptDataset:
    """A loaded data set: prompts in source order, and what loading removed or shortened."""

    source: str
    max_prompt_length: int
    truncation: str
    prompts: list[PromptRow]
    dropped_rows: list[int] = field(default_factory=list)  # filter_overlong_prompts removed these
    num_rows: int = 0  # rows in the source, before filtering

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, i: int) -> PromptRow:
        return self.prompts[i]

    @property
    def num_dropped(self) -> int:
        return len(self.dropped_rows)

    @property
    def truncated_rows(self) -> list[int]:
        return [p.row for p in self.prompts if p.truncated]

    def batches(
        self,
        batch_size: int,
        seed: int = 1,
        *,
        shuffle: bool = True,
        max_epochs: int | None = None,
        state: LoaderState | dict[str, Any] | None = None,
    ) -> BatchIterator:
        """A seeded stream of batches; pass a saved ``state`` to resume where it was taken."""
        return BatchIterator(
            self.prompts, batch_size, seed, shuffle=shuffle, max_epochs=max_epochs, state=state
        )

    def summary(self) -> str:
        lengths = [len(p.input_ids) for p in self.prompts]
        return (
            f"{self.source}: {len(self.prompts)} of {self.num_rows} prompts kept, "
            f"{self.num_dropped} dropped as longer than {self.max_prompt_length} tokens, "
            f"{len(self.truncated_rows)} truncated ({self.truncation}); "
            f"prompt tokens min {min(lengths)}, max {max(lengths)}"
        )


# ----------------------------------------------------------------------------- loading
def _messages(prompt: Any) -> list[dict[str, str]]:
    # Plain dicts with only role and content: parquet and pandas hand back other shapes.
    return [{"role": m["role"], "content": m["content"]} for m in prompt]


def template_prompts(
    rows: Sequence[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, source: str = "<rows>"
) -> list[list[int]]:
    """Token ids of each row's chat-templated prompt (generation prompt added, no extra special
    tokens: the template already has them). Rows the template rejects are reported together."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"tokenizer {type(tokenizer).__name__}: expected a chat template (tokenizer.chat_template), found none"
        )
    texts: list[str] = []
    problems: list[Problem] = []
    for i, row in enumerate(rows):
        try:
            text = tokenizer.apply_chat_template(
                _messages(row["prompt"]), add_generation_prompt=True, tokenize=False
            )
        except Exception as exc:  # jinja raises its own types, e.g. for roles a template refuses
            problems.append(
                Problem(i, "prompt", "messages the chat template accepts", describe_value(str(exc)))
            )
            text = ""
        texts.append(text)
    if problems:
        raise DatasetError(source, problems)
    if not texts:
        return []
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def _too_long_message(source: str, rows: list[int], lengths: list[int], max_length: int) -> str:
    listed = ", ".join(
        f"row {r} has {n} tokens" for r, n in zip(rows[:SHOWN_ROWS], lengths[:SHOWN_ROWS], strict=True)
    )
    more = f", and {len(rows) - SHOWN_ROWS} more" if len(rows) > SHOWN_ROWS else ""
    return (
        f"{source}: {len(rows)} prompt(s) longer than max_prompt_length {max_length} tokens after the "
        f"chat template (truncation='error'): {listed}{more}. Set data.truncation to left, right or "
        f"middle, or data.filter_overlong_prompts=True, or raise data.max_prompt_length."
    )


def load_prompts(
    source: Source,
    tokenizer: PreTrainedTokenizerBase,
    max_prompt_length: int,
    *,
    truncation: str = "error",
    filter_overlong_prompts: bool = False,
    strict: bool = True,
) -> PromptDataset:
    """Validate, template, tokenize, filter and truncate a data set; raise before returning anything.

    Raises ``DatasetError`` (schema problems, or prompts the chat template rejects),
    ``PromptTooLongError`` (truncation "error" and an overlong prompt, or every prompt filtered out)
    and ``ValueError`` (bad arguments)."""
    check_truncation(truncation)
    _check_max_length(max_prompt_length)
    name = source_name(source)
    rows = read_valid_rows(source, strict=strict)
    token_ids = template_prompts(rows, tokenizer, name)

    kept, dropped = (
        filter_overlong(token_ids, max_prompt_length)
        if filter_overlong_prompts
        else (list(range(len(rows))), [])
    )
    if not kept:
        raise PromptTooLongError(
            f"{name}: expected at least one prompt of at most {max_prompt_length} tokens, found none "
            f"of {len(rows)} (filter_overlong_prompts dropped them all; longest {max(map(len, token_ids))})"
        )
    if truncation == "error":
        too_long = overlong_indices([len(token_ids[i]) for i in kept], max_prompt_length)
        if too_long:
            bad = [kept[i] for i in too_long]
            raise PromptTooLongError(
                _too_long_message(name, bad, [len(token_ids[r]) for r in bad], max_prompt_length)
            )

    prompts = []
    for r in kept:
        row = rows[r]
        extra = row.get("extra_info") or {}
        index = extra.get("index")
        ids = token_ids[r]
        prompts.append(
            PromptRow(
                row=r,
                index=int(index) if index is not None else r,
                uid=str(r),
                input_ids=truncate_ids(ids, max_prompt_length, truncation),
                ground_truth=row["reward_model"]["ground_truth"],
                data_source=row["data_source"],
                truncated=len(ids) > max_prompt_length,
            )
        )
    dataset = PromptDataset(name, max_prompt_length, truncation, prompts, dropped, num_rows=len(rows))
    if dropped:
        logger.info("filter_overlong_prompts dropped %d of %d prompts from %s", len(dropped), len(rows), name)
    logger.debug("%s", dataset.summary())
    return dataset
