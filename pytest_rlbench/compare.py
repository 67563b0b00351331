"""Compare a run with a baseline: a gate where both did the same work on the same kind of hardware,
a side-by-side reference otherwise.

Gate or reference (``gate_mismatches``): the work-defining keys must match exactly: the model's
architecture and dtype, the algorithm, train_batch_size, rollout_n, max prompt and response lengths,
ppo_epochs; and so must the hardware kind: device, GPU model (or CPU model and cores), GPUs per node,
nodes and world size; and a baseline saved from a run of the other framework the suites run
(``--rl-trainer``: ours or trl) is a reference, never a gate (``frameworks.framework_mismatch``).
A value the baseline does not state never matches. GPU model names are
compared as written (case and an "NVIDIA " prefix aside): "H100" and "NVIDIA H100 80GB HBM3" differ,
because the first may be a PCIe part.

In a gate, one verdict per measurement: on the same machine each phase's time (timing_s/*) is
judged and its throughput (tokens_per_s_per_gpu/*) listed beside it; custom metrics are judged too.
How a figure is judged (tolerance, noise floor, the one-sided Mann-Whitney U test at p < 0.01, or the
threshold alone against a single figure) is ``pytest_rlbench.verdict``'s; a verdict is "pass",
"fail" or "inconclusive" (too few rounds to reach the level: it names the rounds needed and does not
fail the session). A metric the baseline has and the run lacks fails with reason "missing" when its
phase ran, and is "not run" (neither pass nor fail) when the session did not run that phase (``-k``).
The tolerance is the baseline file's ``tolerances`` entry for the metric id ("timing_s/gen"), else for
its family ("timing_s"), else the default. On the same machine a phase's time on CPU workers is
judged against the session's pace too (``pytest_rlbench.session_pace``), unless either session ran
beside CPU contention (``machine_evidence``: the CPU other processes used beside the phase's rounds);
the rules are ``pytest_rlbench.verdict``'s. Those figures (machine/*) are evidence, never judged
themselves.

In a reference, the baseline's times, throughputs and efficiency figures, and the run's own
efficiency figures (MFU, memory-bandwidth use: they carry across hardware), are listed side by side
with verdict "reference"; nothing passes or fails.

Against a published baseline, whose work was never done on this machine, there is a second kind of
gate (``pytest_rlbench.workload``): when the run's recorded workload matches the baseline's per GPU
(``workload_matches`` empty; the GPU count may differ) and both name their GPU model:
- the same GPU model (names compared by model: "NVIDIA H100 80GB HBM3" is an "H100"): per-GPU
  throughput (tokens_per_s_per_gpu/<phase>) of each phase the baseline publishes is gated, its times
  listed beside;
- another GPU model: hardware-normalised efficiency is gated instead (MFU of the compute-bound phases,
  memory-bandwidth use of gen), derived for both sides by ``derive`` from raw values and workloads.
Each row then names the workload values it rests on that are assumed, and so does the comparison.
A run whose work differs from the baseline's gets references, never a gate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_rlbench.derived import Figure, derive
from pytest_rlbench.frameworks import framework_mismatch
from pytest_rlbench.gate_basis import (
    BASIS_FAMILIES,
    SAME_MACHINE,
    hardware_assumptions,
    normalise_gpu,
    per_gpu_gate,
)
from pytest_rlbench.machine_load import MACHINE, OTHER_CORES, STEAL_CORES, machine_metric
from pytest_rlbench.metrics import (
    DEFAULT_TOLERANCE,
    EFFICIENCY_FAMILIES,
    METRIC_FAMILIES,
    REFERENCE_FAMILIES,
    RETIMED,
    TIMING,
    family_label,
    family_of,
    format_value,
)
from pytest_rlbench.record import RunRecord
from pytest_rlbench.retiming import faster_block, retimed_rounds, retimed_view
from pytest_rlbench.session_pace import session_paces
from pytest_rlbench.verdict import ALPHA as ALPHA  # the rank test's level, for the reports
from pytest_rlbench.verdict import Comparison, MachineEvidence, Mode, judge, tolerance_for
from pytest_rlbench.verdict import Verdict as Verdict
from pytest_rlbench.workload import MODEL_KEYS as MODEL_KEYS  # the model fields a gate needs alike
from pytest_rlbench.workload import model_differences
from pytest_rlbench.workload_format import assumptions
from trainer.phases import PHASE_KEYS

JUDGED = ("pass", "fail", "inconclusive")  # the verdicts of a judged figure


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
    def inconclusive(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.verdict == "inconclusive"]

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
    return out + model_differences(run.model, baseline.model) + _framework_mismatch(run, baseline)


def _framework_mismatch(run: RunRecord, baseline: RunRecord) -> list[str]:
    """A saved run of the other framework (pytest_rlbench.frameworks): a reference, never a gate."""
    return framework_mismatch(run.provenance.framework, baseline.provenance.framework)


# --- A run against a baseline. ----------------------------------------------------------------------


def _order(metric: str) -> tuple[int, int, str]:
    family, _, phase = metric.partition("/")
    phase_rank = PHASE_KEYS.index(phase) if phase in PHASE_KEYS else len(PHASE_KEYS)
    family_rank = METRIC_FAMILIES.index(family) if family in METRIC_FAMILIES else len(METRIC_FAMILIES)
    return phase_rank, family_rank, metric


def _beside_text(rows: list[Comparison]) -> dict[str | None, str]:
    """Per phase, its figures listed beside the judged one, for the judged row's message."""
    out: dict[str | None, list[str]] = {}
    for c in rows:
        if c.verdict == "reference" and c.measured is not None and c.phase is not None:
            text = f"{family_label(c.metric)} {format_value(c.measured, c.unit)} vs {format_value(c.baseline, c.unit)}"
            out.setdefault(c.phase, []).append(text)
    return {phase: "; " + ", ".join(texts) for phase, texts in out.items()}


def custom_metrics(run: RunRecord, baseline: RunRecord) -> set[str]:
    """The records' own metrics that are compared like figures (the machine's figures and re-timed
    rounds are evidence for the verdicts of phase times, never judged themselves)."""
    return {m for m in (*run.metrics, *baseline.metrics) if family_of(m) not in (MACHINE, RETIMED)}


def machine_evidence(run: RunRecord, baseline: RunRecord, phase: str) -> MachineEvidence | None:
    """The CPU used beside ``phase``'s rounds in both sessions, where either recorded it (None: neither)."""
    sides = ((run, OTHER_CORES), (run, STEAL_CORES), (baseline, OTHER_CORES))
    load = [r.metrics.get(machine_metric(f, phase)) for r, f in sides]
    other, steal, base_other = (m.value[0] if m is not None and m.value else None for m in load)
    if other is None and steal is None and base_other is None:
        return None
    return MachineEvidence(other, steal, base_other)


def _gate_rows(
    run: RunRecord, baseline: RunRecord, basis: str, tolerance: float, note: str = "", phase: str | None = None
) -> list[Comparison]:
    """Every figure the baseline has that the gate lists (only ``phase``'s, when given): the judged ones
    with a verdict, the others beside (their text added to the judged row of their phase)."""
    gated, shown = BASIS_FAMILIES[basis]
    read_as = hardware_assumptions(run, baseline, basis)[0] if basis != SAME_MACHINE else baseline
    ours, theirs = derive(run), derive(read_as)
    custom = custom_metrics(run, baseline) if basis == SAME_MACHINE else set()
    # On CPU workers the host's pace drifts between sessions and within them: each phase is judged
    # against its peers, a failure must reproduce, and the baseline's bar is its faster block of rounds.
    on_cpu = basis == SAME_MACHINE and run.hardware.device == "cpu"
    paces = session_paces(run, baseline) if on_cpu else {}
    paces_again = session_paces(retimed_view(run), baseline) if on_cpu else {}  # at the re-timing
    rows = []
    for metric in sorted(theirs, key=_order):
        base_fig, family = theirs[metric], family_of(metric)
        if base_fig.value is None or not (metric in custom or family in gated + shown):
            continue
        if phase is not None and base_fig.phase != phase:
            continue
        timed = ours.get(f"{TIMING}/{base_fig.phase}") if base_fig.phase and metric not in custom else None
        same_machine = basis == SAME_MACHINE and family == TIMING and base_fig.phase is not None
        if same_machine and on_cpu:
            base_fig = faster_block(base_fig, retimed_rounds(baseline, base_fig.phase))
        rows.append(
            judge(
                ours.get(metric), base_fig, baseline.name, tolerance_for(metric, baseline, tolerance), "gate",
                judged=metric in custom or family in gated,
                phase_ran=base_fig.phase is None or metric in custom or base_fig.phase in run.phases,
                run_time=timed.value if timed is not None else None,
                device=run.hardware.device,
                machine=machine_evidence(run, baseline, base_fig.phase) if same_machine else None,
                pace=paces.get(base_fig.phase) if same_machine else None,
                retimed=retimed_rounds(run, base_fig.phase) if same_machine and on_cpu else None,
                pace_again=paces_again.get(base_fig.phase) if same_machine else None,
            )
        )
    beside = _beside_text(rows)
    return [
        replace(c, message=c.message + (beside.get(c.phase, "") if c.verdict in JUDGED else "") + note)
        for c in rows
    ]


def _per_gpu_compare(
    run: RunRecord, baseline: RunRecord, basis: str, tolerance: float, phase: str | None = None
) -> BaselineComparison:
    """The per-GPU gate: each published phase's gated figure judged, the others listed beside."""
    assumed = tuple(hardware_assumptions(run, baseline, basis)[1] + assumptions(baseline.workload))
    names = ", ".join(dict.fromkeys(line.split(" ", 1)[0].rstrip(":") for line in assumed))
    note = f"; rests on {len(assumed)} assumed value(s): {names}" if assumed else ""
    rows = [replace(c, assumptions=assumed) for c in _gate_rows(run, baseline, basis, tolerance, note, phase)]
    source = baseline.provenance.source
    return BaselineComparison(baseline.name, source, "gate", (), tuple(rows), basis, assumed)


def compare(
    run: RunRecord, baseline: RunRecord, tolerance: float = DEFAULT_TOLERANCE, *, phase: str | None = None
) -> BaselineComparison:
    """Compare ``run`` with ``baseline``: a gate on the same machine, a per-GPU gate on the same per-GPU
    work, else a reference; one Comparison per metric (of ``phase``'s figures only, when given)."""
    mismatches = gate_mismatches(run, baseline)
    other_framework = _framework_mismatch(run, baseline)
    if mismatches and not other_framework and run.workload is not None and baseline.workload is not None:
        basis, mismatches = per_gpu_gate(run, baseline)
        if basis is not None:
            return _per_gpu_compare(run, baseline, basis, tolerance, phase)
    source = baseline.provenance.source
    if not mismatches:
        rows = _gate_rows(run, baseline, SAME_MACHINE, tolerance, phase=phase)
        return BaselineComparison(baseline.name, source, "gate", (), tuple(rows), SAME_MACHINE)
    ours, theirs = derive(run), derive(baseline)
    custom = custom_metrics(run, baseline)
    # side by side: what the baseline has, and the run's efficiency figures, which carry across
    metrics = [m for m, f in theirs.items() if (m in custom or f.family in REFERENCE_FAMILIES) and f.value is not None]
    efficiency = [m for m, f in ours.items() if f.family in EFFICIENCY_FAMILIES and f.value is not None]
    metrics += [m for m in efficiency if m not in metrics]
    metrics = [m for m in metrics if phase is None or (theirs.get(m) or ours[m]).phase == phase]
    rows = []
    for metric in sorted(metrics, key=_order):
        base_fig = theirs.get(metric) or _absent(ours[metric])
        tol = tolerance_for(metric, baseline, tolerance)
        rows.append(judge(ours.get(metric), base_fig, baseline.name, tol, "reference"))
    return BaselineComparison(baseline.name, source, "reference", tuple(mismatches), tuple(rows))


def _absent(like: Figure) -> Figure:
    """The baseline's side of a reference row for a figure only the run has."""
    return Figure(like.metric, None, like.unit, like.higher_is_better, reason="not in the baseline")


def compare_all(
    run: RunRecord, baselines: Sequence[RunRecord], tolerance: float = DEFAULT_TOLERANCE
) -> list[BaselineComparison]:
    return [compare(run, b, tolerance) for b in baselines]


def phase_comparisons(
    run: RunRecord, baselines: Sequence[RunRecord], phase: str, tolerance: float = DEFAULT_TOLERANCE
) -> list[BaselineComparison]:
    """One phase's figures against every baseline: what that phase's gate test judges."""
    return [compare(run, b, tolerance, phase=phase) for b in baselines]


def phase_failures(
    run: RunRecord, baselines: Sequence[RunRecord], phase: str, tolerance: float = DEFAULT_TOLERANCE
) -> list[Comparison]:
    """The regressions of one phase's figures against every baseline."""
    return [c for r in phase_comparisons(run, baselines, phase, tolerance) for c in r.failures]
