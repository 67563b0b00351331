"""The run record: one JSON format for stored baselines and for the runs compared with them.

A record holds raw measurements with their provenance: where they come from, the hardware, the model
architecture, the work done (batch, samples per prompt, lengths, parallelism), per-phase seconds (one
value or one sample per benchmark round) and token counts, and, optionally, the workload a replay
needs, each value marked published, inferred or assumed (``pytest_rlbench.records.workload_format``).
Derived figures (tokens/s, MFU, bandwidth use) are never stored as inputs; they are computed by
``pytest_rlbench.verdict.derived.derive``. A source's own published derived figures are kept apart under
``published_derived`` so that ``pytest_rlbench.verdict.consistency`` can recompute them.

Reading validates the whole document and reports every problem with its JSON path
(``$.phases.gen.seconds[1]: expected a number > 0, found -3``) in one ``BaselineError``. Finding the
stored baselines by name is ``pytest_rlbench.records.baselines``'s concern.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from pytest_rlbench.records.files import write_text_atomic
from pytest_rlbench.records.metrics import METRIC_FAMILIES, family_of
from pytest_rlbench.records.typed_json import (
    NON_NEGATIVE,
    POSITIVE,
    SAMPLES,
    JSONFileError,
    describe,
    load_json_file,
    parse_dataclass,
    to_json,
)
from pytest_rlbench.records.workload_format import Workload, check_workload
from trainer.models.flops import DecoderArch
from trainer.phases import PHASE_KEYS

FORMAT_VERSION = 1
SUPPORTED_FORMAT_VERSIONS: tuple[int, ...] = (1,)

# Units a published derived figure may state; consistency.py knows how to recompute each.
PER_GPU_TOKENS_PER_S = "per-GPU tokens/s"
TOTAL_TOKENS_PER_S = "total tokens/s"
PUBLISHED_UNITS: tuple[str, ...] = (PER_GPU_TOKENS_PER_S, TOTAL_TOKENS_PER_S)

DEVICES: tuple[str, ...] = ("gpu", "cpu")
# A phase's seconds: above a clock's resolution (5e-324 s would make every ratio infinite) and under
# about 11.6 days (1e308 s would let any run pass its gate). A tolerance is a fraction, as --rl-tolerance.
PHASE_SECONDS: dict[str, Any] = {**SAMPLES, **POSITIVE, "ge": 1e-9, "le": 1e6}
TOLERANCE: dict[str, Any] = {"ge": 0, "lt": 1}
DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}


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

    source: str  # e.g. "RLinf docs: Comparison with VeRL" or "pytest-rlbench 0.1 run on host"
    framework: str | None = None  # "verl", "rlinf", "pytest-rlbench", "trl 1.16.0"
    commit: str | None = None
    date: str | None = None  # ISO date of the run, when known
    notes: list[str] = field(default_factory=list)
    # Settings the framework could not be given as the suites' config has them (an adapter's list).
    differences: list[str] | None = field(default=None, metadata={"omit_default": True})
    # Phase key -> why the run has no time of its own for it (pytest_rlbench.frameworks.phase_skips):
    # reported as absent, never as "not run".
    absent_phases: dict[str, str] | None = field(default=None, metadata={"omit_default": True})


@dataclass
class Hardware:
    """The machines. gpu_model None means a GPU run whose model was not stated."""

    device: str  # "gpu" or "cpu"
    nodes: int = field(metadata=POSITIVE)
    world_size: int = field(metadata=POSITIVE)  # ranks in all; nodes x gpus_per_node on GPUs
    gpus_per_node: int | None = field(default=None, metadata=NON_NEGATIVE)
    gpu_model: str | None = None
    cpu_model: str | None = None
    cpus_per_node: int | None = field(default=None, metadata=POSITIVE)
    # Which machine of that kind: "gpus <hash of the GPU UUIDs>, driver <version>". A baseline gates any
    # machine of the same kind; it says where each figure came from, and a GPU baseline saved on the
    # machine that runs the gate is judged at the tighter one-machine tolerances (verdict.noise).
    machine: str | None = field(default=None, metadata={"omit_default": True})


@dataclass(frozen=True)
class _Named:
    """ModelArch's first field. A base class because dataclass fields follow the reversed MRO: this puts
    ``name`` before DecoderArch's fields, the key order of the stored baselines."""

    name: str


@dataclass(frozen=True)
class ModelArch(DecoderArch, _Named):
    """A model as a record names it: its name, then the cost-defining numbers of
    ``trainer.models.flops.DecoderArch`` (defined there once; a ModelArch is one), model type and dtype.

    JSON keys in declaration order: name, DecoderArch's fields, model_type, dtype.
    """

    model_type: str = "qwen2"
    dtype: str = "bfloat16"


@dataclass
class RunConfig:
    """The work one step does. None: not stated by the source."""

    algorithm: str = "grpo"
    train_batch_size: int | None = field(default=None, metadata=POSITIVE)  # prompts per step
    rollout_n: int | None = field(default=None, metadata=POSITIVE)  # responses per prompt
    max_prompt_length: int | None = field(default=None, metadata=POSITIVE)
    max_response_length: int | None = field(default=None, metadata=POSITIVE)
    ppo_epochs: int = field(default=1, metadata=POSITIVE)
    # As some sources state it ("Batch Size Per DP"), with no definition of prompts vs responses:
    # used only to list interpretations in consistency checks, never to count work.
    batch_size_per_dp: int | None = field(default=None, metadata=POSITIVE)
    parallelism: dict[str, int] = field(default_factory=dict, metadata=POSITIVE)  # dp, tp, sp, ...
    settings: dict[str, Any] = field(default_factory=dict)  # engine, offload, temperature, ...


@dataclass
class TokenCounts:
    """Token counts of one step's batch. Per-sequence lists, when present, are the most exact input."""

    num_sequences: int | None = field(default=None, metadata=POSITIVE)
    prompt_tokens: int | None = field(default=None, metadata=NON_NEGATIVE)  # sum over sequences
    response_tokens: int | None = field(default=None, metadata=NON_NEGATIVE)
    prompt_length_mean: float | None = field(default=None, metadata=NON_NEGATIVE)
    response_length_mean: float | None = field(default=None, metadata=NON_NEGATIVE)
    prompt_lengths: list[int] | None = field(default=None, metadata=NON_NEGATIVE)
    response_lengths: list[int] | None = field(default=None, metadata=NON_NEGATIVE)
    decode_steps: int | None = field(default=None, metadata=NON_NEGATIVE)  # summed over rollout replicas


@dataclass
class PhaseRecord:
    """One phase's wall seconds: one value, or one sample per round. tokens: if not the step's batch."""

    seconds: list[float] = field(metadata=PHASE_SECONDS)
    tokens: TokenCounts | None = field(default=None, metadata={"omit_default": True})
    # Each timed round's own work, when the rounds worked on different batches (whole steps, each on
    # the next prompts): one per entry of ``seconds``; derived figures then take each round over its own.
    round_tokens: list[TokenCounts] | None = field(default=None, metadata={"omit_default": True})
    # Timed inside whole steps (their breakdown, as VERL times its phases), not by a benchmark of its own:
    # what a session that runs only the step records for each phase it has no benchmark of.
    inside_step: bool = field(default=False, metadata={"omit_default": True})


@dataclass
class Metric:
    """Any other measured value worth comparing (memory, reward, ...)."""

    value: list[float] = field(metadata=SAMPLES)
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
    tolerances: dict[str, float] = field(default_factory=dict, metadata=TOLERANCE)
    # What a replay needs to do the same work (pytest_rlbench.records.workload_format); optional: older files lack it.
    workload: Workload | None = field(default=None, metadata={"omit_default": True})
    format_version: int = FORMAT_VERSION


# Cross-field rules, checked once the types and bounds are right.


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
    if rec.workload is not None:
        check_workload(rec.workload, hw.world_size, "$.workload", problems)
    for key in rec.provenance.absent_phases or {}:
        if key not in PHASE_KEYS or key in rec.phases:
            why = "a timed phase" if key in PHASE_KEYS else "not a phase key"
            problems.append(f"$.provenance.absent_phases.{key}: expected an untimed phase key, found {why}")
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
        if family_of(key) in METRIC_FAMILIES:
            problems.append(f"$.metrics.{key}: the family {family_of(key)!r} is reserved for derived figures")
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
        return None, [f"$: expected an object, found {describe(data)}"]
    version = data.get("format_version")
    if version not in SUPPORTED_FORMAT_VERSIONS or isinstance(version, bool):
        supported = ", ".join(map(str, SUPPORTED_FORMAT_VERSIONS))
        return None, [f"$.format_version: expected {supported}, found {describe(version)}"]
    problems: list[str] = []
    record = parse_dataclass(RunRecord, data, "$", problems)
    if record is not None and not problems:
        _check_record(record, problems)
    return (None if problems else record), problems


def record_from_dict(data: Any, source: str | Path = "<record>") -> RunRecord:
    """A RunRecord from a decoded JSON document; BaselineError naming ``source`` if it is invalid."""
    record, problems = _parse_record(data)
    if record is None:
        raise BaselineError(source, problems)
    return record


def record_to_dict(record: RunRecord) -> dict[str, Any]:
    """The JSON document of a record, format_version first."""
    data = to_json(record)
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
    return write_text_atomic(path, dumps_record(record))  # a reader never sees half a baseline


def load_record(path: str | Path) -> RunRecord:
    """Read and validate one record file; BaselineError naming the file and every problem."""
    path = Path(path)
    try:
        data = load_json_file(path)
    except OSError as exc:
        raise BaselineError(path, [f"cannot read the file: {exc.strerror or exc}"]) from exc
    except JSONFileError as exc:
        raise BaselineError(path, [str(exc)]) from exc
    return record_from_dict(data, source=path)
