"""The plugin's options: what each one means, and how raw values become ``RLBenchOptions``.

Pure parsing: nothing here imports pytest or starts anything, so every rule can be tested on plain
values. ``plugin.py`` registers ``OPTIONS`` with pytest (command line and ini), reads the raw values
(the command line wins over the ini file) and turns an ``OptionError`` into ``pytest.UsageError``.

Every setting has exactly one home. A ``--rl-config`` override of a key that a dedicated option owns
(``trainer.nnodes`` for ``--rl-nodes``, say) is accepted when the option is not given, and then counts
as that option; given both with different values it is an error, so a report never shows one value
while the trainer ran with another.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from trainer.config import (
    KNOWN_BUT_UNSUPPORTED,
    SUPPORTED_CHOICES,
    Config,
    ConfigError,
    apply_override,
    build_config,
    get_value,
    split_override,
)

DEFAULT_MODEL = "tiny"
DEFAULT_ROLLOUT = "hf"
DEFAULT_TOLERANCE = 0.10
DEFAULT_ROUNDS = 5
DEFAULT_WARMUP_ROUNDS = 1
ROLLOUT_KEY = "actor_rollout_ref.rollout.name"
# Ray addresses we refuse: "auto" attaches to whichever cluster was started last on this machine and
# "local" is what leaving the option out means.
REFUSED_ADDRESSES = ("auto", "local")

Kind = Literal["int", "float", "str", "flag", "multi"]


class OptionError(ValueError):
    """An option value that cannot be used. The message starts with the option's name."""


@dataclass(frozen=True)
class OptionSpec:
    """One plugin option: its command-line flag, ini name, kind and one-line help."""

    flag: str
    kind: Kind
    help: str
    metavar: str | None = None
    # A repeatable option whose ini entries come before the command line's instead of being
    # replaced by them (--rl-config: each override is per key, so the command line still wins).
    accumulates: bool = False

    @property
    def dest(self) -> str:
        """The argparse destination, which is also the ini name: ``--rl-nodes`` -> ``rl_nodes``."""
        name = self.flag.lstrip("-").replace("-", "_")
        return name if name.startswith("rl_") else f"rl_{name}"  # --gpu -> rl_gpu in the ini file


_ROLLOUTS = ", ".join(SUPPORTED_CHOICES[ROLLOUT_KEY])

OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec(
        "--rl-nodes",
        "int",
        "Ray nodes the trainer spreads over; the cluster must have this many alive (default 1).",
        "N",
    ),
    OptionSpec(
        "--rl-gpus-per-node",
        "int",
        "GPUs (= workers) per node; needs --gpu (default: all GPUs of the smallest node used).",
        "N",
    ),
    OptionSpec(
        "--gpu",
        "flag",
        "Run on GPUs; fail at start-up if the cluster has fewer than asked for (default: CPU).",
    ),
    OptionSpec(
        "--rl-ray-address",
        "str",
        "Ray cluster to use, host:port (default: $RAY_ADDRESS; else a local Ray the plugin starts and stops).",
        "ADDR",
    ),
    OptionSpec(
        "--rl-model",
        "str",
        "Model preset (tiny, r1-distill-qwen-1.5b, r1-distill-qwen-7b) or a local HF model directory (default tiny).",
        "NAME|PATH",
    ),
    OptionSpec(
        "--rl-dataset",
        "str",
        "Parquet file in VERL's RL schema (default: a synthetic math set generated for the session).",
        "PATH",
    ),
    OptionSpec("--rl-rollout", "str", f"Rollout engine: {_ROLLOUTS} (default {DEFAULT_ROLLOUT}).", "ENGINE"),
    OptionSpec(
        "--rl-config",
        "multi",
        "VERL-style trainer override, e.g. actor_rollout_ref.rollout.n=16 (repeatable).",
        "KEY=VALUE",
        accumulates=True,
    ),
    OptionSpec(
        "--rl-baseline",
        "multi",
        "Baseline to compare with: a stored name or a baseline file (repeatable).",
        "NAME|PATH",
    ),
    OptionSpec(
        "--rl-tolerance",
        "float",
        f"Allowed fraction of slowdown against a baseline, 0 <= t < 1 (default {DEFAULT_TOLERANCE}).",
        "FRACTION",
    ),
    OptionSpec(
        "--rl-rounds",
        "int",
        f"Timed rounds per phase benchmark; the median is compared (default {DEFAULT_ROUNDS}).",
        "N",
    ),
    OptionSpec(
        "--rl-warmup-rounds",
        "int",
        f"Untimed rounds before a phase's timed ones (default {DEFAULT_WARMUP_ROUNDS}).",
        "N",
    ),
    OptionSpec("--rl-report", "str", "Write the benchmark report as JSON to this file.", "PATH"),
    OptionSpec("--rl-save-baseline", "str", "Record this run as a baseline file at PATH.", "PATH"),
)
SPECS: dict[str, OptionSpec] = {spec.dest: spec for spec in OPTIONS}


@dataclass(frozen=True)
class RawValue:
    """A value as the user wrote it, and where: ``--rl-nodes`` or ``rl_nodes (ini)``.

    ``base_dir`` is what a relative path in it is relative to (the invocation directory for the
    command line, the ini file's directory for the ini file)."""

    value: Any
    source: str
    base_dir: Path


@dataclass(frozen=True)
class RLBenchOptions:
    """The parsed options. Defaults are those of a plain ``pytest suites/`` run.

    gpus_per_node None means "all visible GPUs" (resolved against the cluster at session start);
    ray_address None means an embedded local Ray; dataset None means the synthetic math set."""

    nodes: int = 1
    gpus_per_node: int | None = None
    gpu: bool = False
    ray_address: str | None = None
    ray_address_source: str = "embedded"  # which option or variable gave ray_address
    model: str = DEFAULT_MODEL
    dataset: Path | None = None
    rollout: str = DEFAULT_ROLLOUT
    config_overrides: tuple[str, ...] = ()
    baselines: tuple[str, ...] = ()
    tolerance: float = DEFAULT_TOLERANCE
    rounds: int = DEFAULT_ROUNDS
    warmup_rounds: int = DEFAULT_WARMUP_ROUNDS
    report: Path | None = None
    save_baseline: Path | None = None
    sources: Mapping[str, str] = field(default_factory=dict)  # dest -> where the value came from

    @property
    def embedded(self) -> bool:
        return self.ray_address is None

    def source_of(self, dest: str) -> str:
        """How messages name an option: as the user gave it, else by its flag."""
        return self.sources.get(dest, SPECS[dest].flag if dest in SPECS else dest)

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "gpu": self.gpu,
            "ray_address": self.ray_address,
            "model": self.model,
            "dataset": str(self.dataset) if self.dataset else None,
            "rollout": self.rollout,
            "config_overrides": list(self.config_overrides),
            "baselines": list(self.baselines),
            "tolerance": self.tolerance,
            "rounds": self.rounds,
            "warmup_rounds": self.warmup_rounds,
            "report": str(self.report) if self.report else None,
            "save_baseline": str(self.save_baseline) if self.save_baseline else None,
        }


# ----------------------------------------------------------------------------- single values
def _text(raw: RawValue) -> str:
    return str(raw.value).strip()


def _positive_int(raw: RawValue, what: str) -> int:
    text = _text(raw)
    try:
        number = int(text)
    except ValueError:
        raise OptionError(f"{raw.source} expects a whole number of {what} >= 1, got {text!r}") from None
    if number < 1:
        raise OptionError(f"{raw.source} expects a whole number of {what} >= 1, got {number}")
    return number


def _non_negative_int(raw: RawValue, what: str) -> int:
    text = _text(raw)
    try:
        number = int(text)
    except ValueError:
        number = -1
    if number < 0:
        raise OptionError(f"{raw.source} expects a whole number of {what} >= 0, got {text!r}")
    return number


def _flag(raw: RawValue) -> bool:
    if isinstance(raw.value, bool):
        return raw.value
    text = _text(raw).lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise OptionError(f"{raw.source} expects true or false, got {raw.value!r}")


def _tolerance(raw: RawValue) -> float:
    text = _text(raw)
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    # 0 is allowed: a gate that fails on any slowdown (e.g. replaying a run against itself).
    if not (0.0 <= value < 1.0):
        raise OptionError(
            f"{raw.source} expects a fraction t with 0 <= t < 1 (0.10: up to 10% slower passes), got {text!r}"
        )
    return value


def _path(raw: RawValue) -> Path:
    text = _text(raw)
    if not text:
        raise OptionError(f"{raw.source} expects a path, got an empty value")
    path = Path(os.path.expanduser(text))
    return path if path.is_absolute() else raw.base_dir / path


def _output_path(raw: RawValue) -> Path:
    path = _path(raw)
    if path.is_dir():
        raise OptionError(f"{raw.source} expects a file to write, got the directory {str(path)!r}")
    return path


def _ray_address(raw: RawValue) -> str | None:
    text = _text(raw)
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


def check_rollout(name: str, source: str) -> str:
    """Return ``name`` if the trainer has that rollout engine, else raise naming the ones it has."""
    choices = SUPPORTED_CHOICES[ROLLOUT_KEY]
    if name in choices:
        return name
    unsupported = KNOWN_BUT_UNSUPPORTED.get(ROLLOUT_KEY, {})
    if name in unsupported:
        raise OptionError(
            f"{source}={name} is not supported yet: {unsupported[name]}; supported: {', '.join(choices)}"
        )
    raise OptionError(f"{source}={name!r} is not a rollout engine; choose one of: {', '.join(choices)}")


def check_model(name: str, source: str, base_dir: Path) -> str:
    """A preset name as is, or an existing directory as an absolute path; raise naming the presets.

    Only the name is checked here; whether the directory holds a usable model is checked at session
    start (reading config.json means importing transformers)."""
    if name == DEFAULT_MODEL:
        return name  # the default preset: no need to import torch just to look it up
    from trainer.models.presets import PRESETS  # imports torch and transformers: only when asked for

    if name in PRESETS:
        return name
    path = Path(os.path.expanduser(name))
    path = path if path.is_absolute() else base_dir / path
    if path.is_dir():
        return str(path)
    close = difflib.get_close_matches(name, list(PRESETS), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    what = "a file, not a directory" if path.exists() else "neither a preset nor an existing directory"
    raise OptionError(
        f"{source}={name!r} is {what}{hint}; give a preset ({', '.join(PRESETS)}) "
        "or the path of a Hugging Face model directory"
    )


def check_dataset(path: Path, source: str) -> Path:
    """The file must exist here; its content is validated at session start (it may be large)."""
    if not path.exists():
        raise OptionError(
            f"{source}: the data set file {str(path)!r} does not exist; expected a parquet file"
        )
    if not path.is_file():
        raise OptionError(f"{source}: {str(path)!r} is not a file; expected a parquet file")
    return path


def _check_baseline(raw: RawValue, text: str) -> str:
    """A stored baseline's name as is, or a baseline file as an absolute path; raise naming the
    built-in names otherwise. Only existence is checked here; the content when it is compared."""
    from pytest_rlbench.baselines import BaselineError, resolve_baseline

    path = Path(os.path.expanduser(text))
    if not path.is_absolute() and (raw.base_dir / path).is_file():
        return str(raw.base_dir / path)
    try:
        resolve_baseline(text)
    except BaselineError as exc:
        raise OptionError(f"{raw.source}: {exc}") from None
    return str(path) if path.is_file() else text


# ----------------------------------------------------------------------------- --rl-config and owned keys
# Trainer keys that a dedicated option owns, and the option's destination.
OWNED_KEYS: dict[str, str] = {
    "actor_rollout_ref.model.path": "rl_model",
    ROLLOUT_KEY: "rl_rollout",
    "trainer.nnodes": "rl_nodes",
    "trainer.device": "rl_gpu",
    "data.train_files": "rl_dataset",
    "trainer.n_gpus_per_node": "rl_gpus_per_node",  # owned only with --gpu; on CPU: workers per node
}


def _scratch_config(overrides: Sequence[str], source: str) -> tuple[Config, dict[str, str]]:
    """Apply the overrides to a default Config, key by key, naming the option on any error."""
    scratch = Config()
    given: dict[str, str] = {}
    for text in overrides:
        try:
            key, _ = split_override(text)
            apply_override(scratch, text)
        except ConfigError as exc:
            raise OptionError(f"{source}: {exc}") from None
        given[key] = text
    return scratch, given


# ----------------------------------------------------------------------------- the whole set
def parse_options(
    raw: Mapping[str, RawValue | None],
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> RLBenchOptions:
    """Turn raw values (keyed by destination, e.g. ``rl_nodes``; None when not given) into options.

    Raises OptionError naming the option and what would be valid. ``environ`` supplies RAY_ADDRESS."""
    environ = os.environ if environ is None else environ
    cwd = Path.cwd() if cwd is None else cwd
    unknown = sorted(set(raw) - set(SPECS))
    if unknown:
        raise ValueError(f"unknown option destinations {unknown}; known: {sorted(SPECS)}")

    def get(dest: str) -> RawValue | None:
        value = raw.get(dest)
        if (
            value is None
            or value.value is None
            or (isinstance(value.value, (list, tuple)) and not value.value)
        ):
            return None
        return value

    sources = {dest: value.source for dest in SPECS if (value := get(dest)) is not None}

    overrides_raw = get("rl_config")
    overrides = tuple(str(v) for v in overrides_raw.value) if overrides_raw else ()
    config_source = overrides_raw.source if overrides_raw else SPECS["rl_config"].flag
    scratch, given_keys = _scratch_config(overrides, config_source)

    def fold(dest: str, current: Any, check: Callable[[Any, str], Any]) -> Any:
        """The option's value after a --rl-config override of the key it owns, if there is one."""
        key = next((k for k, owner in OWNED_KEYS.items() if owner == dest and k in given_keys), None)
        if key is None:
            return current
        text = given_keys[key]
        value = check(get_value(scratch, key), f"{config_source} {key}")
        if get(dest) is not None and value != current:
            raise OptionError(
                f"{sources[dest]}={current} and {config_source} {text} set the same thing differently; "
                f"give it once, with {SPECS[dest].flag}"
            )
        sources.setdefault(dest, f"{config_source} {text}")
        return value

    def one_file(files: list[str], source: str) -> Path | None:
        if len(files) > 1:
            raise OptionError(
                f"{source}: expected one training file, got {len(files)}; give one with --rl-dataset"
            )
        return check_dataset(_path(RawValue(files[0], source, cwd)), source) if files else None

    # --gpu first: it decides whether trainer.n_gpus_per_node is owned.
    gpu = fold("rl_gpu", _flag(r) if (r := get("rl_gpu")) else False, lambda v, _: v == "cuda")
    nodes = fold(
        "rl_nodes",
        _positive_int(r, "Ray nodes") if (r := get("rl_nodes")) else 1,
        lambda v, src: _positive_int(RawValue(v, src, cwd), "Ray nodes"),
    )
    gpus_per_node = _positive_int(r, "GPUs per node") if (r := get("rl_gpus_per_node")) else None
    if gpu:
        gpus_per_node = fold(
            "rl_gpus_per_node",
            gpus_per_node,
            lambda v, src: _positive_int(RawValue(v, src, cwd), "GPUs per node"),
        )
    elif gpus_per_node is not None:
        # An error rather than ignoring it: the user expects GPUs and would silently get CPU workers.
        raise OptionError(
            f"{sources['rl_gpus_per_node']}={gpus_per_node} needs --gpu (without it the workers run on CPU; "
            "set CPU workers per node with --rl-config trainer.n_gpus_per_node=N)"
        )
    model = fold(
        "rl_model",
        check_model(_text(r), r.source, r.base_dir) if (r := get("rl_model")) else DEFAULT_MODEL,
        lambda v, src: check_model(str(v), src, cwd),
    )
    rollout = fold(
        "rl_rollout",
        check_rollout(_text(r), r.source) if (r := get("rl_rollout")) else DEFAULT_ROLLOUT,
        lambda v, src: check_rollout(str(v), src),
    )
    dataset = fold(
        "rl_dataset", check_dataset(_path(r), r.source) if (r := get("rl_dataset")) else None, one_file
    )

    address: str | None = None
    address_source = "embedded"
    if (r := get("rl_ray_address")) is not None:
        address, address_source = _ray_address(r), r.source
    elif environ.get("RAY_ADDRESS", "").strip():
        env_raw = RawValue(environ["RAY_ADDRESS"], "RAY_ADDRESS", cwd)
        address, address_source = _ray_address(env_raw), "RAY_ADDRESS"
    if address is None:
        address_source = "embedded"

    baselines: tuple[str, ...] = ()
    if (r := get("rl_baseline")) is not None:
        baselines = tuple(_check_baseline(r, str(v).strip()) for v in r.value if str(v).strip())

    opts = RLBenchOptions(
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        gpu=gpu,
        ray_address=address,
        ray_address_source=address_source,
        model=model,
        dataset=dataset,
        rollout=rollout,
        config_overrides=overrides,
        baselines=baselines,
        tolerance=_tolerance(r) if (r := get("rl_tolerance")) else DEFAULT_TOLERANCE,
        rounds=_positive_int(r, "rounds") if (r := get("rl_rounds")) else DEFAULT_ROUNDS,
        warmup_rounds=_non_negative_int(r, "rounds") if (r := get("rl_warmup_rounds")) else DEFAULT_WARMUP_ROUNDS,
        report=_output_path(r) if (r := get("rl_report")) else None,
        save_baseline=_output_path(r) if (r := get("rl_save_baseline")) else None,
        sources=sources,
    )
    # Cross-field checks of the composed trainer config (batch sizes against workers, ...). With
    # --gpu and no --rl-gpus-per-node the GPU count is known only at session start: 1 stands in.
    try:
        build_trainer_config(opts)
    except ConfigError as exc:
        raise OptionError(
            f"the trainer config from the --rl-* options and {config_source} is invalid: {exc}"
        ) from None
    return opts


def build_trainer_config(
    opts: RLBenchOptions,
    gpus_per_node: int | None = None,
    train_file: Path | None = None,
) -> Config:
    """The trainer's Config: the dedicated options first, then the --rl-config overrides.

    gpus_per_node: the resolved count when the options leave it to the cluster (--gpu alone);
    train_file: the data set actually used (the synthetic file when --rl-dataset is not given)."""
    base = Config()
    base.actor_rollout_ref.model.path = opts.model
    base.actor_rollout_ref.rollout.name = opts.rollout
    base.trainer.nnodes = opts.nodes
    base.trainer.device = "cuda" if opts.gpu else "cpu"
    if opts.gpu:
        base.trainer.n_gpus_per_node = opts.gpus_per_node or gpus_per_node or 1
    data_file = opts.dataset or train_file
    base.data.train_files = [str(data_file)] if data_file else []
    # Overrides of owned keys were folded into the options by parse_options (paths made absolute).
    overrides = [o for o in opts.config_overrides if not _is_owned(split_override(o)[0], opts.gpu)]
    return build_config(overrides, base=base)


def _is_owned(key: str, gpu: bool) -> bool:
    if key == "trainer.n_gpus_per_node":
        return gpu  # on CPU it is the number of worker processes per node, the user's to set
    return key in OWNED_KEYS
