"""Prompt length policy on token-id lists: VERL's ``truncation`` modes and ``filter_overlong_prompts``.

The modes and the "middle" split follow VERL's RLHFDataset (verl/utils/dataset/rl_dataset.py):
"error" refuses an overlong prompt, "left" keeps its end, "right" its start, "middle" both ends.
Pure functions on lists of ints; the loader (loader.py) applies them after the chat template.
"""

from __future__ import annotations

from collections.abc import Sequence

TRUNCATION_MODES: tuple[str, ...] = ("error", "left", "right", "middle")
SHOWN_ROWS = 5  # how many overlong rows an error spells out


class PromptTooLongError(ValueError):
    """A prompt is longer than max_prompt_length and truncation is "error"."""


def check_truncation(mode: str) -> str:
    """Return ``mode`` if it is a truncation mode, else raise naming the valid ones."""
    if mode not in TRUNCATION_MODES:
        raise ValueError(f"truncation: expected one of {', '.join(TRUNCATION_MODES)}, found {mode!r}")
    return mode


def check_max_length(max_length: int) -> None:
    """Raise unless ``max_length`` is an integer >= 1 (bools are not lengths)."""
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_prompt_length: expected an integer >= 1, found {max_length!r}")


def truncate_ids(ids: Sequence[int], max_length: int, mode: str = "error") -> list[int]:
    """At most ``max_length`` ids: "left" keeps the last ones, "right" the first ones, "middle" the
    first ``max_length // 2`` and the last ``max_length - max_length // 2`` (VERL's split); "error"
    raises ``PromptTooLongError`` when the list is too long. A short enough list comes back whole."""
    check_truncation(mode)
    check_max_length(max_length)
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
    check_max_length(max_length)
    return [i for i, n in enumerate(lengths) if n > max_length]


def filter_overlong(token_ids: Sequence[Sequence[int]], max_length: int) -> tuple[list[int], list[int]]:
    """Split positions into (kept, dropped): dropped are exactly those longer than ``max_length``."""
    dropped = overlong_indices([len(ids) for ids in token_ids], max_length)
    gone = set(dropped)
    return [i for i in range(len(token_ids)) if i not in gone], dropped


def too_long_message(source: str, rows: list[int], lengths: list[int], max_length: int) -> str:
    """The "error" mode's message: the first ``SHOWN_ROWS`` overlong rows and the settings that help."""
    listed = ", ".join(
        f"row {r} has {n} tokens" for r, n in zip(rows[:SHOWN_ROWS], lengths[:SHOWN_ROWS], strict=True)
    )
    more = f", and {len(rows) - SHOWN_ROWS} more" if len(rows) > SHOWN_ROWS else ""
    return (
        f"{source}: {len(rows)} prompt(s) longer than max_prompt_length {max_length} tokens after the "
        f"chat template (truncation='error'): {listed}{more}. Set data.truncation to left, right or "
        f"middle, or data.filter_overlong_prompts=True, or raise data.max_prompt_length."
    )
