"""Compare a run with a baseline: a gate where both did the same work on the same kind of hardware,
a side-by-side reference otherwise.

Gate or reference (``gate_mismatches``): the work-defining keys must match exactly: the model's
architecture and dtype, the algorithm, train_batch_size, rollout_n, max prompt and response lengths,
ppo_epochs; and so must the hardware kind: device, GPU model (or CPU model and cores), GPUs per node,
nodes and world size. A value the baseline does not state never matches. GPU model names are
compared as written (case and an "NVIDIA " prefix aside): "H100" and "NVIDIA H100 80GB HBM3" differ,
because the first may be a PCIe part.

In a gate, every time (timing_s/*), throughput (tokens_per_s_per_gpu/*) and custom metric the
baseline has is judged:
- a time fails when the run's median is above baseline x (1 + tolerance); a throughput (or any
  higher-is-better metric) when below baseline x (1 - tolerance);
- noise: where both sides have at least two samples, a result past the threshold still passes
  ("inside noise") unless the middle halves of the two sample sets do not overlap, i.e. for a time,
  the run's lower quartile is above the baseline's upper quartile (mirrored for throughputs).
  Quartiles are the inclusive-method quartiles of ``statistics.quantiles``. With one sample on either
  side there is no noise estimate and the threshold alone decides;
- a metric the baseline has and the run lacks fails with reason "missing".
The tolerance is the baseline file's ``tolerances`` entry for the metric id ("timing_s/gen"), else for
its family ("timing_s"), else the default.

In a reference, the baseline's times, throughputs and efficiency figures, and the run's own
efficiency figures (MFU, memory-bandwidth use: they carry across hardware), are listed side by side
with verdict "reference"; nothing passes or fails.

Against a published baseline, whose work was never done on this machine, there is a second kind of
gate (``pytest_rlbench.workload``): when the run's recorded workload matches the baseline's per GPU
(``workload_matches`` empty; the GPU count may differ) and both name their GPU model:
- the same GPU model (names compared by model: "NVIDIA H100 80GB HBM3" is an "H100"): per-GPU
  throughput (tokens_per_s_per_gpu/<phase>) of each phase the baseline publishes is gated, its times
  listed beside as references;
- another GPU model: hardware-normalised efficiency is gated instead (MFU of the compute-bound phases,
  memory-bandwidth use of gen), derived for both sides by ``derive`` from raw values and workloads.
Each row then names the workload values it rests on that are assumed, and so does the comparison.
A run whose work differs from the baseline's gets references, never a gate.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pytest_rlbench.derived import Figure, derive
from pytest_rlbench.gate_basis import (
    PER_GPU_FAMILIES,
    SAME_MACHINE,
    hardware_assumptions,
    normalise_gpu,
    per_gpu_gate,
)
from pytest_rlbench.metrics import (
    DEFAULT_TOLERANCE,
    EFFICIENCY_FAMILIES,
    GATE_FAMILIES,
    METRIC_FAMILIES,
    REFERENCE_FAMILIES,
    TIMING,
    family_of,
    format_value,
    metric_label,
)
from pytest_rlbench.record import RunRecord
from pytest_rlbench.workload import MODEL_KEYS as MODEL_KEYS  # the model fields a gate needs alike
from pytest_rlbench.workload import model_differences
from pytest_rlbench.workload_format import assumptions
from trainer.phases import PHASE_KEYS

Verdict = Literal["pass", "fail", "reference"]
Mode = Literal["gate", "reference"]


@dataclass(frozen=True)
class Comparison:
    """One metric of a run against one baseline."""

    metric: str  # metric id, e.g. "timing_s/update_actor"
    phase: str | None
    measured: float | None
    baseline: float | None
    baseline_source: str  # the baseline's name
    ratio: float | None  # measured / baseline
    tolerance: float
    verdict: Verdict
    reason: str  # "within tolerance", "inside noise", "slower", "lower", "missing", "reference"
    message: str
    unit: str = ""
    assumptions: tuple[str, ...] = ()  # the assumed values the verdict rests on, one line each


@dataclass(frozen=True)
class BaselineComparison:
    """A run against one baseline: the mode, why it is not a gate, and each metric's comparison."""

    baseline: str
    source: str  # the baseline's provenance source
    mode: Mode
    mismatches: tuple[str, ...]
    comparisons: tuple[Comparison, ...] = field(default_factory=tuple)
    basis: str = ""  # for a gate: SAME_MACHINE, PER_GPU or EFFICIENCY
    assumptions: tuple[str, ...] = ()  # the assumed values a per-GPU gate rests on

    @property
    def failures(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.verdict == "fail"]

    @property
    def passed(self) -> bool:
        return not self.failures


# --- Same work, same hardware? ----------------------------------------------------------------------


CONFIG_KEYS: tuple[str, ...] = (
    "algorithm",
    "train_batch_size",
    "rollout_n",
    "max_prompt_length",
    "max_response_length",
    "ppo_epochs",
)


def _hardware_keys(record: RunRecord) -> dict[str, Any]:
    h = record.hardware
    keys: dict[str, Any] = {"hardware.device": h.device, "hardware.nodes": h.nodes, "hardware.world_size": h.world_size}
    if h.device == "gpu":
        gpu = normalise_gpu(h.gpu_model)
        return keys | {"hardware.gpu_model": gpu, "hardware.gpus_per_node": h.gpus_per_node}
    return keys | {"hardware.cpu_model": h.cpu_model, "hardware.cpus_per_node": h.cpus_per_node}


def _work_keys(record: RunRecord) -> dict[str, Any]:
    return {f"config.{k}": getattr(record.config, k) for k in CONFIG_KEYS}


def _diff(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    out = []
    for key, b in theirs.items():  # the baseline's device kind decides which hardware keys count
        a = ours.get(key)
        if b is None:
            out.append(f"{key}: not stated in the baseline" if a is not None else f"{key}: not stated")
        elif a != b:
            out.append(f"{key}: run {a!r}, baseline {b!r}")
    return out


def gate_mismatches(run: RunRecord, baseline: RunRecord) -> list[str]:
    """Why ``run`` and ``baseline`` did not do the same work on the same kind of hardware; empty: a gate.

    Hardware first, then the step's work, then the model (one entry naming the differing fields).
    """
    out = _diff(_hardware_keys(run), _hardware_keys(baseline)) + _diff(_work_keys(run), _work_keys(baseline))
    return out + model_differences(run.model, baseline.model)


# --- Judging one metric. ----------------------------------------------------------------------------


def tolerance_for(metric: str, baseline: RunRecord, default: float) -> float:
    """The baseline's tolerance for the metric id, else for its family, else ``default``."""
    return baseline.tolerances.get(metric, baseline.tolerances.get(family_of(metric), default))


def _quartiles(samples: Sequence[float]) -> tuple[float, float]:
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return q1, q3


def outside_noise(run: Sequence[float], base: Sequence[float], higher_is_better: bool) -> bool:
    """True when the run's samples are clearly worse: their middle half lies beyond the baseline's.

    With fewer than two samples on either side there is no noise estimate, and any difference counts.
    """
    if len(run) < 2 or len(base) < 2:
        return True
    run_q1, run_q3 = _quartiles(run)
    base_q1, base_q3 = _quartiles(base)
    return run_q3 < base_q1 if higher_is_better else run_q1 > base_q3


def _verdict(run_fig: Figure, base_fig: Figure, tolerance: float) -> tuple[Verdict, str]:
    """Gate rules for two present values: threshold, then noise."""
    measured, base = run_fig.value, base_fig.value
    assert measured is not None and base is not None
    if base_fig.higher_is_better:
        beyond, worse = measured < base * (1 - tolerance), "lower"
    else:
        beyond, worse = measured > base * (1 + tolerance), "slower" if base_fig.family == TIMING else "higher"
    if not beyond:
        return "pass", "within tolerance"
    if not outside_noise(run_fig.samples, base_fig.samples, base_fig.higher_is_better):
        return "pass", "inside noise"
    return "fail", worse


def judge(
    run_fig: Figure | None, base_fig: Figure, baseline_name: str, tolerance: float, mode: Mode = "gate"
) -> Comparison:
    """Compare one figure of the run with the baseline's (see the module docstring for the rules)."""
    measured = run_fig.value if run_fig is not None else None
    base, unit = base_fig.value, base_fig.unit
    ratio = measured / base if measured is not None and base else None
    ratio_text = f"ratio {ratio:.2f}" if ratio is not None else "ratio n/a"
    numbers = f"{format_value(measured, unit)} vs {format_value(base, unit)} in baseline '{baseline_name}'"
    verdict: Verdict
    if measured is None:
        verdict, reason = ("fail" if mode == "gate" else "reference"), "missing"
        why = f" ({run_fig.reason})" if run_fig is not None and run_fig.reason else ""
        detail = f"missing from this run{why}; baseline '{baseline_name}' has {format_value(base, unit)}"
    elif mode == "reference" or base is None:
        verdict, reason = "reference", "reference"
        detail = f"{numbers} ({ratio_text}): reference only"
    else:
        assert run_fig is not None
        verdict, reason = _verdict(run_fig, base_fig, tolerance)
        detail = f"{numbers} ({ratio_text}, tolerance {tolerance:.2f}): {reason}"
    message = f"{metric_label(base_fig.metric)}: {detail}"
    return Comparison(
        base_fig.metric, base_fig.phase, measured, base, baseline_name, ratio, tolerance, verdict, reason, message, unit
    )


# --- A run against a baseline. ----------------------------------------------------------------------


def _order(metric: str) -> tuple[int, int, str]:
    family, _, phase = metric.partition("/")
    phase_rank = PHASE_KEYS.index(phase) if phase in PHASE_KEYS else len(PHASE_KEYS)
    family_rank = METRIC_FAMILIES.index(family) if family in METRIC_FAMILIES else len(METRIC_FAMILIES)
    return phase_rank, family_rank, metric


def _per_gpu_compare(run: RunRecord, baseline: RunRecord, basis: str, tolerance: float) -> BaselineComparison:
    """The per-GPU gate: each published phase's gated figure judged, the others listed beside."""
    read_as, hardware = hardware_assumptions(run, baseline, basis)
    assumed = tuple(hardware + assumptions(baseline.workload))
    names = ", ".join(dict.fromkeys(line.split(" ", 1)[0].rstrip(":") for line in assumed))
    note = f"; rests on {len(assumed)} assumed value(s): {names}" if assumed else ""
    gated, shown = PER_GPU_FAMILIES[basis]
    ours, theirs = derive(run), derive(read_as)
    rows = []
    for metric in sorted(theirs, key=_order):
        base_fig = theirs[metric]
        if family_of(metric) not in gated + shown or base_fig.value is None:
            continue
        mode: Mode = "gate" if family_of(metric) in gated else "reference"
        tol = tolerance_for(metric, baseline, tolerance)
        row = judge(ours.get(metric), base_fig, baseline.name, tol, mode)
        rows.append(replace(row, message=row.message + note, assumptions=assumed))
    source = baseline.provenance.source
    return BaselineComparison(baseline.name, source, "gate", (), tuple(rows), basis, assumed)


def compare(run: RunRecord, baseline: RunRecord, tolerance: float = DEFAULT_TOLERANCE) -> BaselineComparison:
    """Compare ``run`` with ``baseline``: a gate on the same machine, a per-GPU gate on the same per-GPU
    work, else a reference; one Comparison per metric."""
    mismatches = gate_mismatches(run, baseline)
    if mismatches and run.workload is not None and baseline.workload is not None:
        basis, mismatches = per_gpu_gate(run, baseline)
        if basis is not None:
            return _per_gpu_compare(run, baseline, basis, tolerance)
    mode: Mode = "reference" if mismatches else "gate"
    ours, theirs = derive(run), derive(baseline)
    custom = set(run.metrics) | set(baseline.metrics)
    families = GATE_FAMILIES if mode == "gate" else REFERENCE_FAMILIES

    def wanted(metric: str) -> bool:
        return metric in custom or family_of(metric) in families

    if mode == "gate":  # what the baseline has, the run must have
        metrics = [m for m, f in theirs.items() if wanted(m) and f.value is not None]
    else:  # side by side: what the baseline has, and the run's efficiency figures, which carry across
        efficiency = [m for m, f in ours.items() if f.family in EFFICIENCY_FAMILIES and f.value is not None]
        metrics = [m for m, f in theirs.items() if wanted(m) and f.value is not None]
        metrics += [m for m in efficiency if m not in metrics]
    rows = []
    for metric in sorted(metrics, key=_order):
        base_fig = theirs.get(metric) or _absent(ours[metric])
        tol = tolerance_for(metric, baseline, tolerance)
        rows.append(judge(ours.get(metric), base_fig, baseline.name, tol, mode))
    basis = SAME_MACHINE if mode == "gate" else ""
    source = baseline.provenance.source
    return BaselineComparison(baseline.name, source, mode, tuple(mismatches), tuple(rows), basis)


def _absent(like: Figure) -> Figure:
    """The baseline's side of a reference row for a figure only the run has."""
    return Figure(like.metric, None, like.unit, like.higher_is_better, reason="not in the baseline")


def compare_all(
    run: RunRecord, baselines: Sequence[RunRecord], tolerance: float = DEFAULT_TOLERANCE
) -> list[BaselineComparison]:
    return [compare(run, b, tolerance) for b in baselines]
