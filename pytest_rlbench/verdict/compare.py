"""A run against a baseline: a gate where both did the same work on the same kind of hardware, a
side-by-side reference otherwise (``gate_mismatches`` says why not a gate). How one figure is then
judged (tolerance, noise floor, rank test, the CPU evidence) is ``pytest_rlbench.verdict.judge``'s.

- Same machine: the work-defining keys (``CONFIG_KEYS``, the model, the framework:
  ``frameworks.framework_mismatch``) and the hardware kind (device, GPU model or CPU model and cores,
  GPUs per node, nodes) match exactly; a value the baseline does not state never matches, and GPU
  names are compared as written ("H100" may be a PCIe part). Each phase's time is judged, its
  throughput listed beside; custom metrics are judged; machine/* and retimed_s/* are evidence only.
- Same per-GPU work as a published baseline (``pytest_rlbench.records.workload.workload_matches``,
  the GPU count may differ): per-GPU throughput is judged on the same GPU model, hardware-normalised
  efficiency (MFU, bandwidth use) on another (``gate_basis``); each row names the assumed workload
  values it rests on.
- Otherwise a reference: the baseline's figures and the run's efficiency figures side by side, with
  verdict "reference"; nothing passes or fails.
A metric the baseline has and the run lacks fails as "missing" when its phase ran, and is "not run"
when the session did not run that phase (``-k``). The tolerance is the baseline file's entry for the
metric id, else for its family, else the session's.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_rlbench.frameworks import framework_mismatch
from pytest_rlbench.records.metrics import (
    CHECKPOINT,
    EFFICIENCY_FAMILIES,
    METRIC_FAMILIES,
    REFERENCE_FAMILIES,
    RETIMED,
    SETUP,
    SIDE_BY_SIDE,
    TIMING,
    WORKERS,
    WRITE_RATE,
    family_label,
    family_of,
    format_value,
)
from pytest_rlbench.records.record import RunRecord
from pytest_rlbench.records.workload import (
    checkpoint_size_note,
    model_differences,
    offload_sharding_note,
    placement_differences,
    save_work_differences,
)
from pytest_rlbench.records.workload_format import assumptions
from pytest_rlbench.records.workload_replay import GPUS_PER_SHARE, SLOWEST_OF, run_shares
from pytest_rlbench.verdict.derived import Figure, derive
from pytest_rlbench.verdict.gate_basis import (
    BASIS_FAMILIES,
    SAME_MACHINE,
    hardware_assumptions,
    normalise_gpu,
    per_gpu_gate,
    with_assumed_gpu,
)
from pytest_rlbench.verdict.judge import ALPHA as ALPHA  # the rank test's level, for the reports
from pytest_rlbench.verdict.judge import (
    OPS,
    ROUND_WORK,
    WORK,
    WORK_KINDS,
    Comparison,
    MachineEvidence,
    Mode,
    WorkEvidence,
    judge,
    tolerance_for,
    work_metric,
)
from pytest_rlbench.verdict.judge import Verdict as Verdict
from pytest_rlbench.verdict.machine_load import (
    GPU,
    MACHINE,
    OTHER_CORES,
    STEAL_CORES,
    GpuEvidence,
    evidence,
    machine_metric,
)
from pytest_rlbench.verdict.noise import (
    DEFAULT_TOLERANCE,
    phase_tolerance,
    short_gpu_phase_note,
    side_by_side_tolerance,
    spread_tolerance,
)
from pytest_rlbench.verdict.retiming import (
    bar_block,
    block_medians,
    retimed_blocks,
    retimed_rounds,
    retimed_view,
)
from pytest_rlbench.verdict.session_pace import SideBySide, session_paces, side_by_side
from trainer.phases import PHASE_KEYS

JUDGED = ("pass", "fail", "inconclusive")  # the verdicts of a judged figure
Wanted = Callable[[str | None], bool]  # which figures' phases a comparison lists


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
    machines: str = ""  # for a gate on GPUs: which machine each side ran on (``machines_text``)

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
    keys = {f"config.{k}": getattr(record.config, k) for k in CONFIG_KEYS}
    # which shares of a replay's drawn lengths it generated (records/replay_draws.py): other rows
    shares, per = run_shares(record)
    return keys | {f"config.settings.{SLOWEST_OF}": shares, f"config.settings.{GPUS_PER_SHARE}": per}


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
    out = hardware_mismatches(run, baseline) + _diff(_work_keys(run), _work_keys(baseline))
    return out + model_differences(run.model, baseline.model) + _framework_mismatch(run, baseline)


def hardware_mismatches(run: RunRecord, baseline: RunRecord) -> list[str]:
    """How ``run``'s hardware differs from ``baseline``'s, as gate_mismatches lists it first; empty: the same kind."""
    return _diff(_hardware_keys(run), _hardware_keys(baseline))


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
    rounds are evidence for the verdicts of phase times, a save's bytes the work behind its figure,
    the set-up's seconds outside every phase and a phase's time outside its workers' own calls: never
    judged themselves)."""
    evidence = (MACHINE, RETIMED, SIDE_BY_SIDE, GPU, WORK, CHECKPOINT, SETUP, WORKERS)
    return {m for m in (*run.metrics, *baseline.metrics) if family_of(m) not in evidence}


def machines_text(run_machine: str | None, base_machine: str | None) -> str:
    """Which machine of the kind each side ran on (``Hardware.machine``: a hash of the GPU UUIDs and
    the driver), in words; empty where either record lacks it (CPU runs, older baselines). Never a
    mismatch: a baseline gates any machine of its kind, and this says where each figure came from."""
    if not run_machine or not base_machine:
        return ""
    if run_machine == base_machine:
        return f"the same machine as the baseline ({run_machine})"
    return f"another machine of this kind: this run {run_machine}; the baseline {base_machine}"


def recorded(record: RunRecord, phase: str, kinds) -> dict[str, float]:
    """The first value of each ``work_metric(kind, phase)`` that ``record`` holds, by kind."""
    found = {kind: record.metrics.get(work_metric(kind, phase)) for kind in kinds}
    return {kind: float(m.value[0]) for kind, m in found.items() if m is not None and m.value}


def counted_work(run: RunRecord, baseline: RunRecord, phase: str) -> WorkEvidence | None:
    """``phase``'s counted work in both sessions, with the work its counted rounds did (None: either
    did not count its ops)."""
    ours, theirs = recorded(run, phase, WORK_KINDS), recorded(baseline, phase, WORK_KINDS)
    if OPS not in ours or OPS not in theirs:
        return None
    return WorkEvidence(ours, theirs, recorded(run, phase, ROUND_WORK), recorded(baseline, phase, ROUND_WORK))


def _tolerance(
    metric: str, baseline: RunRecord, tolerance: float, base_fig: Figure, basis: str, run: RunRecord,
    side_by_side: bool = False,
) -> float:
    """The tolerance a gated figure is judged at: the baseline's or the option's, or where nobody chose
    one and the same work ran on the same kind of GPU, its phase's measured default; on CPU workers, the
    spread of the baseline's own blocks of rounds where wider than the default, unless the phase was
    timed side by side (then that, not the blocks, decides)."""
    applied = tolerance_for(metric, baseline, tolerance)
    if basis != SAME_MACHINE:
        return applied
    if side_by_side:
        return side_by_side_tolerance(applied, base_fig.phase, run.hardware.device)
    if run.hardware.device == "cpu" and base_fig.phase is not None and family_of(metric) == TIMING:
        return spread_tolerance(applied, base_fig.phase, block_medians(baseline, base_fig.phase))
    return phase_tolerance(applied, base_fig.phase, run.hardware.device, saved_on_this_machine(run, baseline))


def saved_on_this_machine(run: RunRecord, baseline: RunRecord) -> bool:
    """Whether the baseline was saved on the machine the run ran on (both name one, and it is the same)."""
    return run.hardware.machine is not None and run.hardware.machine == baseline.hardware.machine


def gpu_evidence(run: RunRecord, baseline: RunRecord, phase: str) -> GpuEvidence | None:
    """The GPU telemetry of ``phase``'s rounds in both sessions (None: the run recorded none)."""

    def values(record: RunRecord) -> dict[str, list[float]]:
        return {name: list(m.value) for name, m in record.metrics.items() if family_of(name) == GPU and m.value}

    return evidence(values(run), values(baseline), phase)


def deciding_side_by_side(run: RunRecord, baseline: RunRecord, phase: str) -> SideBySide | None:
    """``phase``'s side-by-side evidence where it decides its verdict (``judge.against_side_by_side``):
    where both sessions timed it so (on CPU workers; on GPUs its rounds wait on the host), with no
    contention beside its rounds (under contention plain seconds decide); with whether every peer did
    the same counted work as in the baseline."""
    machine = machine_evidence(run, baseline, phase)
    if machine is not None and machine.contended:
        return None
    side = side_by_side(run, baseline, phase)
    if side is None:
        return None
    works = [counted_work(run, baseline, peer) for group in side.groups for peer in group]
    return replace(side, peers_same_work=all(w is not None and w.comparable and w.same for w in works))


def machine_evidence(run: RunRecord, baseline: RunRecord, phase: str) -> MachineEvidence | None:
    """The CPU used beside ``phase``'s rounds in both sessions, where either recorded it (None: neither)."""
    sides = ((run, OTHER_CORES), (run, STEAL_CORES), (baseline, OTHER_CORES))
    load = [r.metrics.get(machine_metric(f, phase)) for r, f in sides]
    other, steal, base_other = (m.value[0] if m is not None and m.value else None for m in load)
    if other is None and steal is None and base_other is None:
        return None
    return MachineEvidence(other, steal, base_other)


def _gate_rows(
    run: RunRecord, baseline: RunRecord, basis: str, tolerance: float, wanted: Wanted, note: str = ""
) -> list[Comparison]:
    """Every figure the baseline has that the gate lists (of the phases ``wanted``): the judged ones
    with a verdict, the others beside (their text added to the judged row of their phase)."""
    gated, shown = BASIS_FAMILIES[basis]
    read_as = hardware_assumptions(run, baseline, basis)[0] if basis != SAME_MACHINE else baseline
    ours, theirs = derive(run), derive(read_as)
    if basis != SAME_MACHINE:
        theirs.update(_over_slowest_shares(run, read_as))
    custom = custom_metrics(run, baseline) if basis == SAME_MACHINE else set()
    # On CPU workers the host's pace drifts between sessions and within them: each phase is judged
    # against its peers, a failure must reproduce, and the baseline's bar is its median block of rounds.
    on_cpu = basis == SAME_MACHINE and run.hardware.device == "cpu"
    paces = session_paces(run, baseline) if on_cpu else {}
    paces_again = session_paces(retimed_view(run), baseline) if on_cpu else {}  # at the re-timing
    other_save = save_work_differences(run, baseline)  # a save of other work: listed, never judged
    rows = []
    for metric in sorted(theirs, key=_order):
        base_fig, family = theirs[metric], family_of(metric)
        if base_fig.value is None or not (metric in custom or family in gated + shown):
            continue
        if not wanted(base_fig.phase):
            continue
        judged = (metric in custom or family in gated) and not (other_save and base_fig.phase == "save_checkpoint")
        if family == WRITE_RATE and not judged and (ours.get(metric) is None or ours[metric].value is None):
            continue  # a save's rate listed beside needs its bytes: without them its time speaks alone
        timed = ours.get(f"{TIMING}/{base_fig.phase}") if base_fig.phase and metric not in custom else None
        same_machine = basis == SAME_MACHINE and family == TIMING and base_fig.phase is not None
        if same_machine and on_cpu:
            base_fig = bar_block(base_fig, retimed_blocks(baseline, base_fig.phase))
        side = deciding_side_by_side(run, baseline, base_fig.phase) if same_machine else None
        rows.append(
            judge(
                ours.get(metric), base_fig, baseline.name,
                _tolerance(metric, baseline, tolerance, base_fig, basis, run, side is not None), "gate",
                judged=judged,
                phase_ran=base_fig.phase is None or metric in custom or base_fig.phase in run.phases,
                run_time=timed.value if timed is not None else None,
                device=run.hardware.device,
                machine=machine_evidence(run, baseline, base_fig.phase) if same_machine else None,
                gpu=gpu_evidence(run, baseline, base_fig.phase) if same_machine else None,
                pace=paces.get(base_fig.phase) if same_machine else None,
                retimed=retimed_rounds(run, base_fig.phase) if same_machine and on_cpu else None,
                pace_again=paces_again.get(base_fig.phase) if same_machine else None,
                work=counted_work(run, baseline, base_fig.phase) if same_machine else None,
                side=side,
            )
        )
    beside = _beside_text(rows)
    if other_save:  # said on the save's rows of a same-machine gate (a per-GPU gate lists checkpoint_size)
        why = f"; not judged: the saves are other work ({'; '.join(other_save)})"
        rows = [replace(c, message=c.message + why) if c.phase == "save_checkpoint" and basis == SAME_MACHINE else c
                for c in rows]
    return [
        replace(c, message=c.message + (beside.get(c.phase, "") + _where(run, baseline, c) if c.verdict in JUDGED else "")
                + (short_gpu_phase_note(c.tolerance_source, c.baseline) if _timed_failure(c) else "") + note)
        for c in rows
    ]


def _timed_failure(c: Comparison) -> bool:
    """A phase's time that failed its gate (``c.baseline`` then is the baseline's median seconds)."""
    return c.verdict == "fail" and family_of(c.metric) == TIMING


def _over_slowest_shares(run: RunRecord, baseline: RunRecord) -> dict[str, Figure]:
    """For a run that generated the baseline's slowest shares: the baseline's figures of the
    phases its slowest GPU timed, over the run's own rows (records/replay_draws.py); else none."""
    from pytest_rlbench.records.replay_draws import over_run_rows, replayed_slowest  # torch: only here

    if not replayed_slowest(run, baseline):
        return {}
    read, phases = over_run_rows(run, baseline)
    return {m: f for m, f in derive(read).items() if f.phase in phases}


def _where(run: RunRecord, baseline: RunRecord, c: Comparison) -> str:
    """Said of a judged figure whose phase either side timed inside whole steps (their breakdown), not
    with a benchmark of its own: the run's ("as VERL times it"), or only the baseline's."""
    ours, theirs = run.phases.get(c.phase or ""), baseline.phases.get(c.phase or "")
    if ours is not None and ours.inside_step:
        return "; timed inside the step, as VERL times it"
    if theirs is not None and theirs.inside_step:
        return "; the baseline's was timed inside the step, this run's by a benchmark of its own"
    return ""


def _placement_note(run: RunRecord, baseline: RunRecord) -> str:
    placed = placement_differences(run, baseline)
    return f"; memory placed otherwise ({'; '.join(placed)})" if placed else ""


def _per_gpu_compare(run: RunRecord, baseline: RunRecord, basis: str, tolerance: float, wanted: Wanted) -> BaselineComparison:
    """The per-GPU gate: each published phase's gated figure judged, the others listed beside."""
    from pytest_rlbench.records.replay_draws import slowest_worker_note  # draws lengths with torch: only here

    assumed = tuple(
        hardware_assumptions(run, baseline, basis)[1]
        + assumptions(baseline.workload)
        + slowest_worker_note(run, baseline)
        + offload_sharding_note(run, baseline)
        + (checkpoint_size_note(run, baseline) if wanted("save_checkpoint") else [])
    )
    names = ", ".join(dict.fromkeys(line.split(" ", 1)[0].rstrip(":") for line in assumed))
    note = f"; rests on {len(assumed)} assumed value(s): {names}" if assumed else ""
    note += _placement_note(run, baseline)
    rows = [replace(c, assumptions=assumed) for c in _gate_rows(run, baseline, basis, tolerance, wanted, note)]
    source = baseline.provenance.source
    return BaselineComparison(baseline.name, source, "gate", (), tuple(rows), basis, assumed)


def compare(
    run: RunRecord,
    baseline: RunRecord,
    tolerance: float = DEFAULT_TOLERANCE,
    *,
    phase: str | None = None,
    skip: Collection[str] = (),
) -> BaselineComparison:
    """Compare ``run`` with ``baseline``: a gate on the same machine, a per-GPU gate on the same per-GPU
    work, else a reference; one Comparison per metric (of ``phase``'s figures only, when given; none of
    the phases in ``skip``)."""

    def wanted(figure_phase: str | None) -> bool:
        return (phase is None or figure_phase == phase) and figure_phase not in skip

    mismatches = gate_mismatches(run, baseline)
    other_framework = _framework_mismatch(run, baseline)
    if mismatches and not other_framework and run.workload is not None and baseline.workload is not None:
        assumed = with_assumed_gpu(baseline)  # listed among the assumptions of the gate it allows
        basis, mismatches = per_gpu_gate(run, assumed)
        if basis is not None:
            return _per_gpu_compare(run, assumed, basis, tolerance, wanted)
    source = baseline.provenance.source
    if not mismatches:
        rows = _gate_rows(run, baseline, SAME_MACHINE, tolerance, wanted, _placement_note(run, baseline))
        machines = machines_text(run.hardware.machine, baseline.hardware.machine)
        return BaselineComparison(baseline.name, source, "gate", (), tuple(rows), SAME_MACHINE, machines=machines)
    ours, theirs = derive(run), derive(baseline)
    custom = custom_metrics(run, baseline)
    # side by side: what the baseline has, and the run's efficiency figures, which carry across
    metrics = [m for m, f in theirs.items() if (m in custom or f.family in REFERENCE_FAMILIES) and f.value is not None]
    efficiency = [m for m, f in ours.items() if f.family in EFFICIENCY_FAMILIES and f.value is not None]
    metrics += [m for m in efficiency if m not in metrics]
    metrics = [m for m in metrics if wanted((theirs.get(m) or ours[m]).phase)]
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
    run: RunRecord,
    baselines: Sequence[RunRecord],
    tolerance: float = DEFAULT_TOLERANCE,
    decided: Mapping[str, Sequence[BaselineComparison]] | None = None,
) -> list[BaselineComparison]:
    """``run`` against every baseline. ``decided``: phase -> its gate test's results (one per baseline,
    in order), kept as they are: a phase is judged once, and the summary, the JSON report and the chart
    show the verdict its gate test gave (a later gate's re-timing cannot change it)."""
    decided = decided or {}
    out = []
    for i, baseline in enumerate(baselines):
        result = compare(run, baseline, tolerance, skip=decided.keys())
        kept = [c for results in decided.values() for c in results[i].comparisons]
        assert all(results[i].baseline == baseline.name for results in decided.values())
        rows = sorted((*result.comparisons, *kept), key=lambda c: _order(c.metric))
        out.append(replace(result, comparisons=tuple(rows)))
    return out


def phase_comparisons(
    run: RunRecord, baselines: Sequence[RunRecord], phase: str, tolerance: float = DEFAULT_TOLERANCE
) -> list[BaselineComparison]:
    """One phase's figures against every baseline: what that phase's gate test judges."""
    return [compare(run, b, tolerance, phase=phase) for b in baselines]
