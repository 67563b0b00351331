"""Run records: one JSON format for stored baselines and for the runs compared with them.

A record holds raw measurements with their provenance: where they come from, the hardware, the model
architecture, the work done (batch, samples per prompt, lengths, parallelism), per-phase seconds (one
value or one sample per benchmark round) and token counts. Derived figures (tokens/s, MFU, bandwidth
use) are never stored as inputs; they are computed by ``pytest_rlbench.derived.derive``. A source's own
published derived figures are kept apart under ``published_derived`` so that
``pytest_rlbench.consistency`` can recompute them.

Loading validates the whole document and reports every problem with its JSON path
(``$.phases.gen.seconds[1]: expected a number > 0, found -3``) in one ``BaselineError``.

Built-in baselines live as JSON files in the repository's top-level ``baselines/`` directory; see
``baseline_dirs`` for how an installed package finds them.
"""

from __future__ import annotations

import json
import math
import re
import typing
from collections.abc import Iterable, Sequence
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from datetime import date
from pathlib import Path
from types import NoneType, UnionType
from typing import Any

from trainer.phases import PHASE_KEYS

FORMAT_VERSION = 1
SUPPORTED_FORMAT_VERSIONS: tuple[int, ...] = (1,)

# Metric families. A metric id is "family/phase" (e.g. "timing_s/gen"); tolerances may name a whole
# family. tokens_per_s_per_gpu/step is VERL's perf/throughput.
TIMING = "timing_s"
TIMING_PER_TOKEN = "timing_per_token_ms"
THROUGHPUT = "tokens_per_s_per_gpu"
MFU = "mfu"
BANDWIDTH = "bandwidth_util"
METRIC_FAMILIES: tuple[str, ...] = (TIMING, TIMING_PER_TOKEN, THROUGHPUT, MFU, BANDWIDTH)

# Units a published derived figure may state; consistency.py knows how to recompute each.
PER_GPU_TOKENS_PER_S = "per-GPU tokens/s"
TOTAL_TOKENS_PER_S = "total tokens/s"
PUBLISHED_UNITS: tuple[str, ...] = (PER_GPU_TOKENS_PER_S, TOTAL_TOKENS_PER_S)

DEVICES: tuple[str, ...] = ("gpu", "cpu")
DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}

# Field metadata understood by the parser below.
_SAMPLES = {"samples": True}  # a number or a non-empty list of numbers; saved as a number when one
_POSITIVE = {"gt": 0}
_NON_NEGATIVE = {"ge": 0}


class BaselineError(ValueError):
    """A run record that cannot be used: not found, not JSON, or not valid. Names the file and problems."""

    def __init__(self, source: str | Path, problems: Sequence[str]) -> None:
        self.source = str(source)
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{self.source}: not a usable run record ({len(self.problems)} problem(s)):\n{lines}")


@dataclass
class Provenance:
    """Where the numbers come from."""

    source: str  # e.g. "seed: Compare with Verl, last updated 07/22/2025" or "pytest-rlbench run"
    framework: str | None = None  # "verl", "rlinf", "pytest-rlbench"
    commit: str | None = None
    date: str | None = None  # ISO date of the run, when known
    notes: list[str] = field(default_factory=list)


@dataclass
class Hardware:
    """The machines. gpu_model None means a GPU run whose model was not stated."""

    device: str  # "gpu" or "cpu"
    nodes: int = field(metadata=_POSITIVE)
    world_size: int = field(metadata=_POSITIVE)  # ranks in all; nodes x gpus_per_node on GPUs
    gpus_per_node: int | None = field(default=None, metadata=_NON_NEGATIVE)
    gpu_model: str | None = None
    cpu_model: str | None = None
    cpus_per_node: int | None = field(default=None, metadata=_POSITIVE)


@dataclass
class ModelArch:
    """A dense decoder's cost-defining numbers (names as in trainer.models.flops.DecoderArch)."""

    name: str
    num_layers: int = field(metadata=_POSITIVE)
    hidden_size: int = field(metadata=_POSITIVE)
    intermediate_size: int = field(metadata=_POSITIVE)
    num_heads: int = field(metadata=_POSITIVE)
    num_kv_heads: int = field(metadata=_POSITIVE)
    head_dim: int = field(metadata=_POSITIVE)
    vocab_size: int = field(metadata=_POSITIVE)
    tie_word_embeddings: bool = False
    model_type: str = "qwen2"
    dtype: str = "bfloat16"


@dataclass
class RunConfig:
    """The work one step does. None: not stated by the source."""

    algorithm: str = "grpo"
    train_batch_size: int | None = field(default=None, metadata=_POSITIVE)  # prompts per step
    rollout_n: int | None = field(default=None, metadata=_POSITIVE)  # responses per prompt
    max_prompt_length: int | None = field(default=None, metadata=_POSITIVE)
    max_response_length: int | None = field(default=None, metadata=_POSITIVE)
    ppo_epochs: int = field(default=1, metadata=_POSITIVE)
    # As some sources state it ("Batch Size Per DP"), with no definition of prompts vs responses:
    # used only to list interpretations in consistency checks, never to count work.
    batch_size_per_dp: int | None = field(default=None, metadata=_POSITIVE)
    parallelism: dict[str, int] = field(default_factory=dict, metadata=_POSITIVE)  # dp, tp, sp, ...
    settings: dict[str, Any] = field(default_factory=dict)  # engine, offload, temperature, ...


@dataclass
class TokenCounts:
    """Token counts of one step's batch. Per-sequence lists, when present, are the most exact input."""

    num_sequences: int | None = field(default=None, metadata=_POSITIVE)
    prompt_tokens: int | None = field(default=None, metadata=_NON_NEGATIVE)  # sum over sequences
    response_tokens: int | None = field(default=None, metadata=_NON_NEGATIVE)
    prompt_length_mean: float | None = field(default=None, metadata=_NON_NEGATIVE)
    response_length_mean: float | None = field(default=None, metadata=_NON_NEGATIVE)
    prompt_lengths: list[int] | None = field(default=None, metadata=_NON_NEGATIVE)
    response_lengths: list[int] | None = field(default=None, metadata=_NON_NEGATIVE)
    decode_steps: int | None = field(default=None, metadata=_NON_NEGATIVE)  # summed over rollout replicas


@dataclass
class PhaseRecord:
    """One phase's wall seconds: one value, or one sample per round. tokens: if not the step's batch."""

    seconds: list[float] = field(metadata={**_SAMPLES, **_POSITIVE})
    tokens: TokenCounts | None = field(default=None, metadata={"omit_default": True})


@dataclass
class Metric:
    """Any other measured value worth comparing (memory, reward, ...)."""

    value: list[float] = field(metadata=_SAMPLES)
    unit: str
    higher_is_better: bool


@dataclass
class PublishedFigure:
    """A derived figure as its source published it. Kept for checking, never used as an input."""

    value: float
    unit: str  # one of PUBLISHED_UNITS
    phase: str  # the phase whose time it divides by
    label: str  # the source's own name, e.g. "gen throughput"
    source: str | None = None  # when not the record's own source


@dataclass
class RunRecord:
    """A stored baseline or a recorded run."""

    name: str
    provenance: Provenance
    hardware: Hardware
    model: ModelArch
    config: RunConfig
    tokens: TokenCounts = field(default_factory=TokenCounts)
    phases: dict[str, PhaseRecord] = field(default_factory=dict)
    metrics: dict[str, Metric] = field(default_factory=dict)
    published_derived: dict[str, PublishedFigure] = field(default_factory=dict)
    tolerances: dict[str, float] = field(default_factory=dict, metadata=_NON_NEGATIVE)
    format_version: int = FORMAT_VERSION


# ---------------------------------------------------------------------------------------------------
# Parsing: one generic walk over the dataclasses' annotations, collecting every problem with its path.


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {json.dumps(value)}"
    if isinstance(value, int | float):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {value!r}"
    return "an array" if isinstance(value, list) else "an object"


def _bound_problem(value: float, meta: typing.Mapping[str, Any]) -> str | None:
    if "gt" in meta and not value > meta["gt"]:
        return f"expected a number > {meta['gt']}, found {value!r}"
    if "ge" in meta and not value >= meta["ge"]:
        return f"expected a number >= {meta['ge']}, found {value!r}"
    return None


def _parse_value(tp: Any, value: Any, path: str, problems: list[str], meta: typing.Mapping[str, Any]) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, UnionType):  # only Optional[X] is used
        if value is None:
            return None
        tp = next(a for a in args if a is not NoneType)
        origin, args = typing.get_origin(tp), typing.get_args(tp)
    if is_dataclass(tp):
        return _parse_dataclass(tp, value, path, problems)
    if origin is list:
        if meta.get("samples") and isinstance(value, int | float) and not isinstance(value, bool):
            value = [value]  # a single sample may be written as a plain number
        if not isinstance(value, list) or (meta.get("samples") and not value):
            what = "a number or a non-empty array of numbers" if meta.get("samples") else "an array"
            problems.append(f"{path}: expected {what}, found {_kind(value)}")
            return None
        return [_parse_value(args[0], v, f"{path}[{i}]", problems, meta) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            problems.append(f"{path}: expected an object, found {_kind(value)}")
            return None
        return {k: _parse_value(args[1], v, f"{path}.{k}", problems, meta) for k, v in value.items()}
    return _parse_scalar(tp, value, path, problems, meta)


def _parse_scalar(tp: Any, value: Any, path: str, problems: list[str], meta: typing.Mapping[str, Any]) -> Any:
    if tp is Any:
        return value
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    else:
        ok = isinstance(value, tp)
    if not ok:
        name = {bool: "a boolean", int: "an integer", float: "a finite number", str: "a string"}[tp]
        problems.append(f"{path}: expected {name}, found {_kind(value)}")
        return None
    if tp in (int, float):
        bound = _bound_problem(value, meta)
        if bound:
            problems.append(f"{path}: {bound}")
        return float(value) if tp is float else value
    return value


def _parse_dataclass(cls: type, data: Any, path: str, problems: list[str]) -> Any:
    if not isinstance(data, dict):
        problems.append(f"{path}: expected an object, found {_kind(data)}")
        return None
    hints = typing.get_type_hints(cls)
    names = [f.name for f in fields(cls)]
    for key in data:
        if key not in names:
            problems.append(f"{path}.{key}: unknown field; expected one of: {', '.join(names)}")
    kwargs = {}
    for f in fields(cls):
        if f.name in data:
            kwargs[f.name] = _parse_value(hints[f.name], data[f.name], f"{path}.{f.name}", problems, f.metadata)
        elif f.default is MISSING and f.default_factory is MISSING:
            problems.append(f"{path}.{f.name}: required field missing")
    try:
        return cls(**kwargs)
    except TypeError:  # a required field was missing: already reported
        return None


def _check_record(rec: RunRecord, problems: list[str]) -> None:
    """Rules that span fields: the parser has already checked types and bounds."""
    hw = rec.hardware
    if hw.device not in DEVICES:
        problems.append(f"$.hardware.device: expected one of {', '.join(DEVICES)}, found {hw.device!r}")
    elif hw.device == "gpu":
        if not hw.gpus_per_node:
            problems.append(f"$.hardware.gpus_per_node: a GPU run needs an integer >= 1, found {hw.gpus_per_node!r}")
        elif hw.world_size != hw.nodes * hw.gpus_per_node:
            problems.append(
                f"$.hardware.world_size: expected nodes x gpus_per_node = {hw.nodes * hw.gpus_per_node}, "
                f"found {hw.world_size}"
            )
    elif hw.gpu_model is not None or hw.gpus_per_node:
        problems.append("$.hardware: a CPU run has no gpu_model or gpus_per_node")
    if rec.model.dtype not in DTYPE_BYTES:
        problems.append(f"$.model.dtype: expected one of {', '.join(DTYPE_BYTES)}, found {rec.model.dtype!r}")
    if rec.provenance.date is not None:
        try:
            date.fromisoformat(rec.provenance.date)
        except ValueError:
            problems.append(f"$.provenance.date: expected an ISO date (YYYY-MM-DD), found {rec.provenance.date!r}")
    _check_tokens(rec.tokens, "$.tokens", problems)
    for key, phase in rec.phases.items():
        if key not in PHASE_KEYS:
            problems.append(f"$.phases.{key}: unknown phase key; expected one of: {', '.join(PHASE_KEYS)}")
        if phase.tokens is not None:
            _check_tokens(phase.tokens, f"$.phases.{key}.tokens", problems)
    for key, fig in rec.published_derived.items():
        if fig.unit not in PUBLISHED_UNITS:
            problems.append(
                f"$.published_derived.{key}.unit: expected one of {PUBLISHED_UNITS}, found {fig.unit!r}"
            )
        if fig.phase not in PHASE_KEYS:
            problems.append(f"$.published_derived.{key}.phase: expected a phase key, found {fig.phase!r}")
    for key in rec.metrics:
        if key.partition("/")[0] in METRIC_FAMILIES:
            problems.append(f"$.metrics.{key}: the family {key.partition('/')[0]!r} is reserved for derived figures")
    for key in rec.tolerances:
        family, _, phase = key.partition("/")
        if family in METRIC_FAMILIES and phase and phase not in PHASE_KEYS:
            problems.append(f"$.tolerances.{key}: {phase!r} is not a phase key")
        elif family not in METRIC_FAMILIES and key not in rec.metrics:
            problems.append(
                f"$.tolerances.{key}: expected a metric family ({', '.join(METRIC_FAMILIES)}), "
                "'family/phase', or a name in $.metrics"
            )


def _check_tokens(tok: TokenCounts, path: str, problems: list[str]) -> None:
    lists = {"prompt_lengths": tok.prompt_lengths, "response_lengths": tok.response_lengths}
    sizes = {name: len(v) for name, v in lists.items() if v is not None}
    if len(set(sizes.values())) > 1:
        problems.append(f"{path}: prompt_lengths and response_lengths differ in length: {sizes}")
    for name, size in sizes.items():
        if tok.num_sequences is not None and size != tok.num_sequences:
            problems.append(f"{path}.{name}: {size} entries, but num_sequences is {tok.num_sequences}")
    for lengths, total, total_name in (
        (tok.prompt_lengths, tok.prompt_tokens, "prompt_tokens"),
        (tok.response_lengths, tok.response_tokens, "response_tokens"),
    ):
        if lengths is not None and total is not None and None not in lengths and sum(lengths) != total:
            problems.append(f"{path}.{total_name}: {total}, but the per-sequence lengths sum to {sum(lengths)}")


def validate(data: Any) -> list[str]:
    """Every problem in a decoded JSON document, each with its JSON path; empty when it is valid.

    Types, bounds, missing and unknown fields are all reported together; the rules that span fields
    (world size, phase keys, token sums, units) are checked once those pass.
    """
    return _parse_record(data)[1]


def _parse_record(data: Any) -> tuple[RunRecord | None, list[str]]:
    if not isinstance(data, dict):
        return None, [f"$: expected an object, found {_kind(data)}"]
    version = data.get("format_version")
    if version not in SUPPORTED_FORMAT_VERSIONS or isinstance(version, bool):
        supported = ", ".join(map(str, SUPPORTED_FORMAT_VERSIONS))
        return None, [f"$.format_version: expected {supported}, found {_kind(version)}"]
    problems: list[str] = []
    record = _parse_dataclass(RunRecord, data, "$", problems)
    if record is not None and not problems:
        _check_record(record, problems)
    return (None if problems else record), problems


def record_from_dict(data: Any, source: str | Path = "<record>") -> RunRecord:
    """A RunRecord from a decoded JSON document; BaselineError naming ``source`` if it is invalid."""
    record, problems = _parse_record(data)
    if record is None:
        raise BaselineError(source, problems)
    return record


# ---------------------------------------------------------------------------------------------------
# Writing.


def _to_json(value: Any, meta: typing.Mapping[str, Any] | None = None) -> Any:
    meta = meta or {}
    if is_dataclass(value):
        out = {}
        for f in fields(value):
            item = getattr(value, f.name)
            if f.metadata.get("omit_default") and item == f.default:
                continue
            out[f.name] = _to_json(item, f.metadata)
        return out
    if isinstance(value, dict):
        return {k: _to_json(v, meta) for k, v in value.items()}
    if isinstance(value, list):
        if meta.get("samples") and len(value) == 1:
            return value[0]
        return [_to_json(v) for v in value]
    return value


def record_to_dict(record: RunRecord) -> dict[str, Any]:
    """The JSON document of a record, format_version first."""
    data = _to_json(record)
    return {"format_version": data.pop("format_version"), **data}


# An indented array whose items are all numbers (JSON strings cannot hold a raw newline, so no false hits).
_NUMBER_ARRAY = re.compile(r"\[\s+([-+\d.eE,\s]+?)\s+\]")


def dumps_record(record: RunRecord) -> str:
    """Indented JSON with arrays of plain numbers kept on one line, so long samples stay readable."""
    text = json.dumps(record_to_dict(record), indent=2, ensure_ascii=False)
    return _NUMBER_ARRAY.sub(lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]", text) + "\n"


def save_record(record: RunRecord, path: str | Path) -> Path:
    """Validate and write ``record`` to ``path``; BaselineError naming the path if it is not valid."""
    path = Path(path)
    data = record_to_dict(record)
    record_from_dict(json.loads(json.dumps(data)), source=path)  # refuse to write what we could not read back
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps_record(record), encoding="utf-8")
    return path


def load_record(path: str | Path) -> RunRecord:
    """Read and validate one record file; BaselineError naming the file and every problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BaselineError(path, [f"cannot read the file: {exc.strerror or exc}"]) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(path, [f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"]) from exc
    return record_from_dict(data, source=path)


# ---------------------------------------------------------------------------------------------------
# Finding baselines by name.

# Short names users pass to --rl-baseline; each file's stem works too.
BUILTIN_BASELINES: dict[str, str] = {
    "verl-7b": "verl-f252da3-r1-distill-qwen-7b-8x8.json",
    "verl-v0.5.0-1.5b": "verl-v0.5.0-8fdc4d3-r1-distill-qwen-1.5b-1x8-h100.json",
    "rlinf-1.5b": "rlinf-r1-distill-qwen-1.5b-1x8-h100.json",
}

_PACKAGE_DIR = Path(__file__).resolve().parent


def baseline_dirs(extra: Iterable[str | Path] = ()) -> list[Path]:
    """Directories searched for baseline files, first match wins, each listed once.

    ``extra`` (e.g. from a plugin hook) first; then the package's ``baselines_data``: in a checkout a
    symbolic link to the top-level ``baselines/`` (the canonical copy), in a built wheel a real
    directory holding copies of the files (package data); then the checkout's ``baselines/`` itself,
    for a checkout where the link did not survive (e.g. on Windows).
    """
    candidates = [Path(p) for p in extra] + [_PACKAGE_DIR / "baselines_data", _PACKAGE_DIR.parent / "baselines"]
    found: dict[Path, Path] = {}
    for d in candidates:
        if d.is_dir():
            found.setdefault(d.resolve(), d)
    return list(found.values())


def resolve_baseline(name_or_path: str | Path, search_dirs: Iterable[str | Path] = ()) -> Path:
    """The file for a built-in name, a file stem in a baseline directory, or a path."""
    text = str(name_or_path)
    dirs = baseline_dirs(search_dirs)
    wanted = BUILTIN_BASELINES.get(text, text if text.endswith(".json") else f"{text}.json")
    direct = Path(text).expanduser()
    if direct.is_file():
        return direct
    for d in dirs:
        if (d / wanted).is_file():
            return d / wanted
    searched = ", ".join(str(d) for d in dirs) or "(no baseline directory found)"
    raise BaselineError(
        text,
        [
            f"no such file, and no baseline of that name; built-in names: {', '.join(BUILTIN_BASELINES)}; "
            f"searched: {searched}"
        ],
    )


def load_baseline(name_or_path: str | Path, search_dirs: Iterable[str | Path] = ()) -> RunRecord:
    """Resolve and load a baseline (see ``resolve_baseline``)."""
    return load_record(resolve_baseline(name_or_path, search_dirs))
