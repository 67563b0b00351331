"""One option value at a time: the raw value as the user wrote it, and the parsers that turn it into
a number, flag, path or Ray address, raising ``OptionError`` that names the option and what is valid.

Nothing here imports pytest or starts anything; an output path is probed on disk (``records.files``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_rlbench.options.table import PROGRESS_MODES
from pytest_rlbench.records.files import write_problem

# Ray addresses we refuse: "auto" attaches to whichever cluster was started last on this machine and
# "local" is what leaving the option out means.
REFUSED_ADDRESSES = ("auto", "local")


class OptionError(ValueError):
    """An option value that cannot be used. The message starts with the option's name."""


@dataclass(frozen=True)
class RawValue:
    """A value as the user wrote it, and where: ``--rl-nodes`` or ``rl_nodes (ini)``.

    ``base_dir`` is what a relative path in it is relative to (the invocation directory for the
    command line, the ini file's directory for the ini file)."""

    value: Any
    source: str
    base_dir: Path
    ini_count: int = 0  # of a list value: how many leading entries came from the ini file


def text_of(raw: RawValue) -> str:
    """The value as text; a repeatable option's values joined by spaces (as a message shows them)."""
    return " ".join(texts_of(raw))


def texts_of(raw: RawValue) -> list[str]:
    """A repeatable option's values (one value given alone counts as a list of one), blanks dropped."""
    items = raw.value if isinstance(raw.value, (list, tuple)) else [raw.value]
    return [text for item in items if (text := str(item).strip())]


def positive_int(raw: RawValue, what: str) -> int:
    text = text_of(raw)
    try:
        number = int(text)
    except ValueError:
        raise OptionError(f"{raw.source} expects a whole number of {what} >= 1, got {text!r}") from None
    if number < 1:
        raise OptionError(f"{raw.source} expects a whole number of {what} >= 1, got {number}")
    return number


def non_negative_int(raw: RawValue, what: str) -> int:
    text = text_of(raw)
    try:
        number = int(text)
    except ValueError:
        number = -1
    if number < 0:
        raise OptionError(f"{raw.source} expects a whole number of {what} >= 0, got {text!r}")
    return number


def flag(raw: RawValue) -> bool:
    if isinstance(raw.value, bool):
        return raw.value
    text = text_of(raw).lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise OptionError(f"{raw.source} expects true or false, got {raw.value!r}")


def _number(text: str) -> float:
    """The text as a float; NaN (which every range check refuses) when it is not a number."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def tolerance(raw: RawValue) -> float:
    text = text_of(raw)
    value = _number(text)
    # 0 is allowed: a gate that fails on any slowdown (e.g. replaying a run against itself).
    if not (0.0 <= value < 1.0):
        raise OptionError(
            f"{raw.source} expects a fraction t with 0 <= t < 1 (0.10: up to 10% slower passes), got {text!r}"
        )
    return value


def mismatch_limit(raw: RawValue) -> float:
    """A limit on token_mult_prob_error, a mean of exp|x| and so never below 1: finite and >= 1."""
    text = text_of(raw)
    value = _number(text)
    if not (1.0 <= value < math.inf):
        raise OptionError(
            f"{raw.source} expects a limit F >= 1 on token_mult_prob_error (1 is a perfect match; 1.1: "
            f"NeMo-RL's CI limit), got {text!r}"
        )
    return value


def seconds(raw: RawValue, what: str) -> float:
    """A duration in seconds, finite and > 0."""
    text = text_of(raw)
    value = _number(text)
    if not (0.0 < value < math.inf):
        raise OptionError(f"{raw.source} expects {what} in seconds, a number > 0, got {text!r}")
    return value


def path(raw: RawValue) -> Path:
    text = text_of(raw)
    if not text:
        raise OptionError(f"{raw.source} expects a path, got an empty value")
    out = Path(os.path.expanduser(text))
    return out if out.is_absolute() else raw.base_dir / out


def output_path(raw: RawValue) -> Path:
    """A file the session can write at its end: checked now, so no result is lost after the run."""
    out = path(raw)
    problem = write_problem(out)
    if problem:
        raise OptionError(f"{raw.source} expects a file it can write, got {str(out)!r}: {problem}")
    return out


def ray_address(raw: RawValue) -> str | None:
    text = text_of(raw)
    if not text:
        return None
    if text.lower() in REFUSED_ADDRESSES:
        raise OptionError(
            f"{raw.source}={text!r} is refused: give the head node's host:port (e.g. 10.0.0.1:6379), "
            "or leave it out for an embedded local Ray"
        )
    if any(c.isspace() for c in text):
        raise OptionError(f"{raw.source} expects host:port, got {text!r}")
    return text


def progress_mode(raw: RawValue) -> str:
    """--rl-progress: auto, on or off (case aside)."""
    text = text_of(raw).lower()
    if text not in PROGRESS_MODES:
        raise OptionError(f"{raw.source} expects one of {', '.join(PROGRESS_MODES)}, got {text_of(raw)!r}")
    return text
