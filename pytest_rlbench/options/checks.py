"""Checks of what an option names: a rollout engine, a model, a data set file, a baseline, a framework.

Each returns the value to use (a relative path made absolute) or raises ``OptionError`` naming the
option and what would be valid. Only cheap checks happen here, at start-up; the content of a model
directory or data set is read when the session builds it.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
from pathlib import Path

from pytest_rlbench.frameworks import FRAMEWORKS, TRL
from pytest_rlbench.options.values import OptionError, RawValue
from pytest_rlbench.records.baselines import resolve_baseline
from pytest_rlbench.records.record import BaselineError, RunRecord, load_record
from trainer.config import ROLLOUT_KEY, ConfigError, check_choice

DEFAULT_MODEL = "tiny"
# The files a model directory holds its weights in (one of them), as from_pretrained reads them.
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def check_rollout(name: str, source: str) -> str:
    """Return ``name`` if the trainer has that rollout engine, else raise naming the ones it has."""
    try:
        check_choice(ROLLOUT_KEY, name, shown=source, invalid="is not a rollout engine")
    except ConfigError as exc:
        raise OptionError(str(exc)) from None
    return name


def check_rollouts(names: list[str], source: str) -> tuple[str, ...]:
    """The engines ``--rl-rollout`` names, each checked (``check_rollout``): the first is the one the
    trainer rolls out with, the others the rollout panel's (see docs/fidelity.md). None, or one name
    twice, is an error."""
    if not names:
        raise OptionError(f"{source} expects a rollout engine, got an empty value")
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise OptionError(
            f"{source} names {', '.join(twice)} more than once; give each engine once "
            f"(the first trains, the others join the rollout panel), got {' '.join(names)}"
        )
    return tuple(check_rollout(name, source) for name in names)


def check_model(name: str, source: str, base_dir: Path) -> str:
    """A preset name as is, or an existing directory as an absolute path; raise naming the presets.

    A directory must hold a config.json and a weights file (``model_dir_problem``); whether
    transformers can read them is checked at session start (that means importing it)."""
    if name == DEFAULT_MODEL:
        return name  # the default preset: no need to import torch just to look it up
    path = Path(os.path.expanduser(name))
    path = path if path.is_absolute() else base_dir / path
    if "/" in name and path.is_dir():  # a path (no preset name has a slash): checked without torch
        return checked_model_dir(path, name, source)
    from trainer.models.presets import PRESETS  # imports torch and transformers: only when asked for

    if name in PRESETS:
        return name
    if path.is_dir():
        return checked_model_dir(path, name, source)
    close = difflib.get_close_matches(name, list(PRESETS), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    what = "a file, not a directory" if path.exists() else "neither a preset nor an existing directory"
    raise OptionError(
        f"{source}={name!r} is {what}{hint}; give a preset ({', '.join(PRESETS)}) "
        "or the path of a Hugging Face model directory"
    )


def checked_model_dir(path: Path, name: str, source: str) -> str:
    """The model directory as an absolute path, or OptionError naming what it lacks."""
    problem = model_dir_problem(path)
    if problem:
        raise OptionError(f"{source}={name!r}: {problem}")
    return str(path)


def model_dir_problem(path: Path) -> str | None:
    """What a model directory lacks of what from_pretrained reads (a config.json, a weights file), or
    None; the files' content is read at session start."""
    found = ", ".join(sorted(p.name for p in path.iterdir())[:8]) or "nothing"
    if not (path / "config.json").is_file():
        return f"{str(path)!r} has no config.json (found {found}); expected a Hugging Face model directory"
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        return (
            f"{str(path)!r} has a config.json but no weights: expected one of {', '.join(WEIGHT_FILES)}, "
            f"found {found}"
        )
    return None


def check_dataset(path: Path, source: str) -> Path:
    """The file must exist here; its content is validated at session start (it may be large)."""
    if not path.exists():
        raise OptionError(
            f"{source}: the data set file {str(path)!r} does not exist; expected a parquet file"
        )
    if not path.is_file():
        raise OptionError(f"{source}: {str(path)!r} is not a file; expected a parquet file")
    return path


def load_baseline_option(raw: RawValue, text: str) -> tuple[str, RunRecord]:
    """The baseline an option names (a stored name, or a file: made absolute), loaded and validated once
    for the session; raise naming the built-in names, or what the file gets wrong."""
    path = Path(os.path.expanduser(text))
    if not path.is_absolute() and (raw.base_dir / path).is_file():
        path = raw.base_dir / path
    shown = str(path) if path.is_file() else text
    try:
        found = resolve_baseline(shown)
    except BaselineError as exc:
        raise OptionError(f"{raw.source}: {exc}") from None
    try:
        return shown, load_record(found)
    except BaselineError as exc:
        raise OptionError(f"{raw.source} {exc}") from None


def check_trainers(given: list[str], source: str) -> tuple[str, ...]:
    """The frameworks --rl-trainer names, in the order given (repeats dropped), each known and
    installed (found, not imported: cheap). Several run in one session, one after the other."""
    names = tuple(dict.fromkeys(str(v).strip() for v in given))
    for name in names:
        if name not in FRAMEWORKS:
            raise OptionError(
                f"{source}={name!r} is not a framework the suites can run; "
                f"expected one of {', '.join(FRAMEWORKS)}"
            )
        if name == TRL and importlib.util.find_spec("trl") is None:
            raise OptionError(
                f"{source}={name!r} needs TRL, which is not installed: pip install 'pytest-rlbench[trl]'"
            )
    return names
