"""Load a VERL-schema data set into token ids ready for rollout: ``load_prompts`` and ``PromptDataset``.

The steps, in the order of VERL's RLHFDataset (verl/utils/dataset/rl_dataset.py): validate every row
(validate.py; by default only what the trainer reads, so any text RL file VERL's preprocessors write
loads, whatever its extra_info), apply the tokenizer's chat template with ``add_generation_prompt=True``
(chat_template.py), tokenize, drop overlong prompts if ``filter_overlong_prompts``, then apply
``truncation`` ("error", "left", "right", "middle") to what is still too long (truncation.py). Every
check runs before anything is returned: a data set loads whole or raises.

``PromptDataset.batches`` gives the seeded, resumable stream of ``train_batch_size`` prompts
(batches.py). The names those modules define are importable from here too, as callers use them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from trainer.data.batches import BatchIterator, LoaderState, PromptBatch, PromptRow, epoch_order
from trainer.data.chat_template import prompt_messages, template_prompts
from trainer.data.truncation import (
    SHOWN_ROWS,
    TRUNCATION_MODES,
    PromptTooLongError,
    check_max_length,
    check_truncation,
    filter_overlong,
    overlong_indices,
    too_long_message,
    truncate_ids,
)
from trainer.data.validate import Source, read_valid_rows, source_name

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


def ground_truth_text(value: Any) -> str:
    """The answer the reward compares with, from a valid ground truth: a string as it is, an integer
    (hellaswag.py's label) as its digits, a list of answers (the Search-R1 script's {target: [...]})
    as its first answer: the bundled reward (trainer/driver/reward.py) scores one answer."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        value = value["target"]
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        return str(value)
    return str(value[0])


def row_index(row: Mapping[str, Any], position: int) -> int:
    """extra_info.index when it is an integer; else (no extra_info, no index, DAPO's uuid strings)
    the row's position in the source."""
    extra = row.get("extra_info")
    index = extra.get("index") if isinstance(extra, Mapping) else None
    if isinstance(index, (int, np.integer)) and not isinstance(index, (bool, np.bool_)):
        return int(index)
    return position


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
        """A seeded stream of batches; pass a saved ``state`` to resume where it was taken (its seed
        wins; its batch size, prompt count and shuffle must match these)."""
        start = LoaderState(seed, 0, 0, batch_size, len(self.prompts), shuffle)
        stream = BatchIterator(self.prompts, start, max_epochs)
        if state is not None:
            stream.load_state_dict(state if isinstance(state, dict) else state.to_dict())
        return stream

    def summary(self) -> str:
        lengths = [len(p.input_ids) for p in self.prompts]
        return (
            f"{self.source}: {len(self.prompts)} of {self.num_rows} prompts kept, "
            f"{self.num_dropped} dropped as longer than {self.max_prompt_length} tokens, "
            f"{len(self.truncated_rows)} truncated ({self.truncation}); "
            f"prompt tokens min {min(lengths)}, max {max(lengths)}"
        )


def load_prompts(
    source: Source,
    tokenizer: PreTrainedTokenizerBase,
    max_prompt_length: int,
    *,
    truncation: str = "error",
    filter_overlong_prompts: bool = False,
    strict: bool = False,
) -> PromptDataset:
    """Validate, template, tokenize, filter and truncate a data set; raise before returning anything.

    ``strict=False`` (the default, what a run uses) requires only what the trainer reads: data_source,
    the prompt's messages and reward_model.ground_truth; extra_info and other columns may be anything.
    ``strict=True`` also requires the reference schema (schema.RL_SCHEMA). Multi-modal data is refused
    either way.

    Raises ``DatasetError`` (schema problems, or prompts the chat template rejects),
    ``PromptTooLongError`` (truncation "error" and an overlong prompt, or every prompt filtered out)
    and ``ValueError`` (bad arguments)."""
    check_truncation(truncation)
    check_max_length(max_prompt_length)
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
                too_long_message(name, bad, [len(token_ids[r]) for r in bad], max_prompt_length)
            )

    prompts = []
    several_answers = 0
    for r in kept:
        row = rows[r]
        ids = token_ids[r]
        truth = row["reward_model"]["ground_truth"]
        several_answers += not isinstance(truth, str) and _answer_count(truth) > 1
        prompts.append(
            PromptRow(
                row=r,
                index=row_index(row, r),
                uid=str(r),
                input_ids=truncate_ids(ids, max_prompt_length, truncation),
                ground_truth=ground_truth_text(truth),
                data_source=row["data_source"],
                truncated=len(ids) > max_prompt_length,
                messages=tuple(prompt_messages(row["prompt"])),
            )
        )
    dataset = PromptDataset(name, max_prompt_length, truncation, prompts, dropped, num_rows=len(rows))
    if several_answers:
        logger.warning(
            "%s: %d of %d prompts have several accepted answers in reward_model.ground_truth; the "
            "bundled math reward scores each against its first",
            name,
            several_answers,
            len(prompts),
        )
    if dropped:
        logger.info("filter_overlong_prompts dropped %d of %d prompts from %s", len(dropped), len(rows), name)
    logger.debug("%s", dataset.summary())
    return dataset


def _answer_count(value: Any) -> int:
    if isinstance(value, Mapping):
        value = value.get("target")
    return len(value) if hasattr(value, "__len__") and not isinstance(value, (str, bytes)) else 1


__all__ = [
    "SHOWN_ROWS",
    "TRUNCATION_MODES",
    "BatchIterator",
    "LoaderState",
    "PromptBatch",
    "PromptDataset",
    "PromptRow",
    "PromptTooLongError",
    "check_truncation",
    "epoch_order",
    "filter_overlong",
    "ground_truth_text",
    "load_prompts",
    "overlong_indices",
    "row_index",
    "template_prompts",
    "truncate_ids",
]
