"""What a benchmark session measured, turned into a run record, compared, reported and saved.

The ``rl_bench`` fixture hands each phase's timed rounds to ``BenchRecorder.record``; the trainer
fixtures describe the work (model, config, the batch's token counts) and where it ran. At the end of
the session ``finish`` builds one ``RunRecord`` (the same format as a stored baseline), compares it
with every baseline, and writes the JSON report, its chart and, if asked, the record as a baseline.
Each file is written on its own and atomically (``records.files``); a file that cannot be written is one
line in ``SessionOutcome.problems``, never a lost report. A baseline is saved only from a complete
session (``incomplete`` None): a partial one would silently stop gating the phases it lacks.
"""

from __future__ import annotations

import datetime
import platform
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_rlbench import __version__
from pytest_rlbench.frameworks import OURS_LABEL
from pytest_rlbench.markers import phase_key_problem
from pytest_rlbench.records.files import dumps_report, failure_line, write_atomic, write_text_atomic
from pytest_rlbench.records.metrics import (
    ROLLOUT_FIDELITY,
    SETUP,
    STEP_METRICS,
    family_of,
    setup_figures,
    step_evidence_unit,
)
from pytest_rlbench.records.record import (
    BaselineError,
    Hardware,
    Metric,
    ModelArch,
    PhaseRecord,
    Provenance,
    RunConfig,
    RunRecord,
    TokenCounts,
    load_record,
    record_from_dict,
    record_to_dict,
    save_record,
)
from pytest_rlbench.records.workload_format import Workload
from pytest_rlbench.reports.chart import chart_path_for, nothing_to_draw, write_chart
from pytest_rlbench.reports.json_report import build_report
from pytest_rlbench.verdict.compare import BaselineComparison, compare, compare_all
from pytest_rlbench.verdict.consistency import Finding, check_record
from pytest_rlbench.verdict.derived import derive
from pytest_rlbench.verdict.gate_basis import SAME_MACHINE
from pytest_rlbench.verdict.retiming import POOLED_SESSIONS, pooled_sessions, with_earlier_sessions
from trainer.phases import CHECKPOINT_BYTES, OUTSIDE_STEP, STEP_PHASES

if TYPE_CHECKING:
    from pytest_rlbench.options.parsed import RLBenchOptions

MISMATCH_METRIC = f"{ROLLOUT_FIDELITY}/token_mult_prob_error"  # what --rl-max-mismatch limits


@dataclass
class RunContext:
    """Where and on what the benchmarks ran; filled in by the fixtures that build those things."""

    hardware: Hardware | None = None
    model: ModelArch | None = None
    config: RunConfig | None = None
    tokens: TokenCounts | None = None  # of the batch the phase benchmarks ran on
    workload: Workload | None = None  # what the run was configured to do (pytest_rlbench.records.workload)
    framework: str = OURS_LABEL  # whose trainer ran: "pytest-rlbench", "trl 1.16.0"
    differences: list[str] = field(default_factory=list)  # settings its adapter could not make equal
    absent_phases: dict[str, str] = field(default_factory=dict)  # phase -> why the trainer cannot time it
    gpus: list[tuple[str, int]] = field(default_factory=list)  # (GPU UUID, worker PID) per GPU worker


@dataclass
class SessionOutcome:
    run: RunRecord
    results: list[BaselineComparison]
    findings: list[Finding]
    written: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # outputs not written, one line each
    notes: list[str] = field(default_factory=list)  # outputs left out on purpose, one line each (not failures)
    write_failed: bool = False  # an output could not be written (the exit status says so)
    step_breakdown: list[dict[str, float]] = field(default_factory=list)  # whole-step rounds' own timing
    others: list[SessionOutcome] = field(default_factory=list)  # the further --rl-trainer frameworks'

    @property
    def regressions(self) -> list[str]:
        return [c.message for r in self.results for c in r.failures] + [m for o in self.others for m in o.regressions]


def git_commit(cwd: Path) -> str | None:
    """The checked-out commit of the code under test, when it is a git checkout; ``-dirty`` after it
    when the tree differs from that commit (changed or new files that git does not ignore), so a
    report never names a commit that did not hold the code that ran."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0 or not head.stdout.strip():
            return None
        status = subprocess.run(["git", "status", "--porcelain"], cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    dirty = status.returncode != 0 or bool(status.stdout.strip())
    return head.stdout.strip() + ("-dirty" if dirty else "")


def local_hardware(cpu_model: str, cpus: int | None) -> Hardware:
    """A CPU run on this machine alone (no cluster was needed)."""
    return Hardware(device="cpu", nodes=1, world_size=1, gpus_per_node=0, cpu_model=cpu_model, cpus_per_node=cpus)


class BenchRecorder:
    """Collects a session's measurements; one per pytest session."""

    def __init__(self, name: str, code_dir: Path) -> None:
        self.name = name
        self.code_dir = code_dir
        self.context = RunContext()
        self.phases: dict[str, PhaseRecord] = {}
        self.sources: dict[str, str] = {}  # phase -> test node id that measured it
        self.metrics: dict[str, Metric] = {}
        self.step_breakdown: list[dict[str, float]] = []  # per whole-step round: seconds by key
        self.inside_step_work: list[TokenCounts] = []  # per whole-step round: its batch's token counts
        self.inside_step_source = ""  # the test whose whole steps they were
        # phase -> its gate test's results against every baseline (pytest_rlbench.session.gate_items):
        # the end of the session reuses them instead of judging the phase again
        self.verdicts: dict[str, list[BaselineComparison]] = {}

    def record(
        self,
        phase: str,
        samples: list[float],
        nodeid: str,
        tokens: TokenCounts | None = None,
        round_tokens: list[TokenCounts] | None = None,
    ) -> None:
        """One phase's timed rounds; ``tokens`` the work of a round (when not the step's batch), or
        ``round_tokens`` the work of each round (when every round had its own batch)."""
        if (problem := phase_key_problem(phase)) is not None:
            raise ValueError(f"{nodeid}: {phase!r} {problem}")
        if phase in self.phases:
            raise ValueError(
                f"{nodeid}: phase {phase!r} was already timed by {self.sources[phase]}; one benchmark per phase"
            )
        if not samples:
            raise ValueError(f"{nodeid}: no timed rounds for phase {phase!r}")
        if round_tokens is not None and len(round_tokens) != len(samples):
            raise ValueError(f"{nodeid}: {len(round_tokens)} token counts for {len(samples)} rounds of {phase!r}")
        self.phases[phase] = PhaseRecord(
            seconds=[float(s) for s in samples], tokens=tokens, round_tokens=round_tokens
        )
        self.sources[phase] = nodeid

    def add_metric(self, name: str, values: list[float], unit: str, higher_is_better: bool) -> None:
        self.metrics[name] = Metric(value=[float(v) for v in values], unit=unit, higher_is_better=higher_is_better)

    def add_step_breakdown(
        self, rounds: list[dict[str, float]], nodeid: str = "", round_tokens: list[TokenCounts] | None = None
    ) -> None:
        """Whole-step rounds' own phase seconds (as the trainer's StepResult.timing_s has them), for the
        report's "extra" section; ``round_tokens`` each round's work, for the phases timed inside them."""
        self.step_breakdown.extend({key: float(seconds) for key, seconds in r.items()} for r in rounds)
        if round_tokens is not None:
            self.inside_step_work.extend(round_tokens)
            self.inside_step_source = self.inside_step_source or nodeid

    def _inside_step_phases(self) -> dict[str, PhaseRecord]:
        """The phases of the step that no benchmark of their own timed, from the step's rounds: how VERL
        times them, so a session of whole steps alone can still gate each published phase."""
        rounds, work = self.step_breakdown, self.inside_step_work
        if not rounds or len(work) != len(rounds):  # each round's work is needed for its throughput
            return {}
        out = {}
        for phase in (*STEP_PHASES, *OUTSIDE_STEP):  # save_checkpoint: in the breakdown when save_freq saves
            if phase in self.phases or not all(phase in r for r in rounds):
                continue
            out[phase] = PhaseRecord(
                seconds=[r[phase] for r in rounds], tokens=work[-1], round_tokens=list(work), inside_step=True
            )
        return out

    def _step_less_its_saves(self) -> dict[str, PhaseRecord]:
        """The step benchmark's rounds less the save each also ran (trainer.save_freq saves inside the
        timed call, after the step's span): VERL's step excludes save_checkpoint, so the recorded one
        does too. Empty where no round of the step's own benchmark saved."""
        step, rounds = self.phases.get("step"), self.step_breakdown
        if step is None or self.sources.get("step") != self.inside_step_source or len(rounds) != len(step.seconds):
            return {}
        saves = [r.get("save_checkpoint", 0.0) for r in rounds]
        if not any(saves):
            return {}
        return {"step": replace(step, seconds=[s - saved for s, saved in zip(step.seconds, saves, strict=True)])}

    def add_step_metrics(self, rounds: list[Mapping[str, float]]) -> None:
        """Whole-step rounds' own figures (StepResult.metrics) that ``STEP_METRICS`` names, one sample
        per round, as the run's metrics (compared with a baseline's like any other), and each phase's
        peak GPU memory and time around its workers' own calls (``step_evidence_unit``): recorded, never
        judged."""
        for name, (unit, higher_is_better) in STEP_METRICS.items():
            values = [r[name] for r in rounds if name in r]
            if values:
                self.add_metric(name, values, unit, higher_is_better)
        # each phase's peak GPU memory (the gpu family) and its time outside the workers' own calls (the
        # workers family): evidence, never judged
        for name in dict.fromkeys(key for r in rounds for key in r):
            unit = step_evidence_unit(name)
            if unit is not None:
                self.add_metric(name, [r[name] for r in rounds if name in r], unit, higher_is_better=False)
        self.add_checkpoint_bytes([r[CHECKPOINT_BYTES] for r in rounds if CHECKPOINT_BYTES in r])

    def add_checkpoint_bytes(self, sizes: list[float]) -> None:
        """The bytes each timed save wrote (``CHECKPOINT_BYTES``): the work behind save_checkpoint's
        GB/s per GPU, recorded as evidence (the checkpoint family is never judged on its own)."""
        if sizes:
            self.add_metric(CHECKPOINT_BYTES, sizes, "B", higher_is_better=False)

    def add_setup_figures(self, workers: list[dict[str, Any]]) -> None:
        """What the slowest worker's set-up spent outside every phase (``setup_figures``), as evidence."""
        for metric, seconds in setup_figures(workers).items():
            self.add_metric(metric, [seconds], "s", higher_is_better=False)

    @property
    def measured_anything(self) -> bool:
        """A phase timed or a metric recorded (a session of the rollout panel alone records metrics
        only); the set-up's seconds, recorded once the trainer is built, measure nothing of its own."""
        return bool(self.phases or any(family_of(m) != SETUP for m in self.metrics))

    @property
    def described(self) -> bool:
        """Whether the fixtures have said where and on what the run ran (needed for a record)."""
        return not self._undescribed()

    def _undescribed(self) -> list[str]:
        return [name for name in ("hardware", "model", "config") if getattr(self.context, name) is None]

    @cached_property
    def session_provenance(self) -> Provenance:
        """Where this session's numbers come from, worked out once (``git rev-parse`` is a subprocess)."""
        return Provenance(
            source=f"pytest-rlbench {__version__} run on {platform.node()}",
            framework=OURS_LABEL,
            commit=git_commit(self.code_dir),
            date=datetime.date.today().isoformat(),
        )

    def build_record(self) -> RunRecord:
        """The run so far as a record; RuntimeError if the fixtures never described the run."""
        ctx = self.context
        missing = self._undescribed()
        if missing:
            raise RuntimeError(f"the run's {', '.join(missing)} were never described: no rl_* fixture ran")
        notes = [f"{phase}: {nodeid}" for phase, nodeid in self.sources.items()]
        inside, step = self._inside_step_phases(), self._step_less_its_saves()
        notes += [f"{phase}: inside the steps of {self.inside_step_source}" for phase in inside]
        notes += [f"step: {self.inside_step_source}, each round less the save_checkpoint it ran" for _ in step]
        return RunRecord(
            name=self.name,
            provenance=replace(
                self.session_provenance,
                notes=notes,
                framework=ctx.framework,
                differences=ctx.differences or None,
                absent_phases={k: v for k, v in ctx.absent_phases.items() if k not in self.phases} or None,
            ),
            hardware=ctx.hardware,
            model=ctx.model,
            config=ctx.config,
            tokens=ctx.tokens or TokenCounts(),
            phases={**inside, **self.phases, **step},
            metrics=dict(self.metrics),
            workload=ctx.workload,
        )

    def phase_figures(self, phase: str) -> dict[str, float]:
        """One recorded phase's time and derived figures at the median (metric id -> value), e.g. for
        pytest-benchmark's extra_info; figures without a value are left out. Empty until the run is
        described (rl_bench used without the trainer fixtures)."""
        if not self.described:
            return {}
        figures = derive(self.build_record()).values()
        return {f.metric: f.value for f in figures if f.phase == phase and f.value is not None}

    def finish(
        self,
        baselines: list[RunRecord],
        tolerance: float,
        report_path: Path | None,
        save_path: Path | None,
        update_record: Any = None,
        update_report: Any = None,
        incomplete: str | None = None,
    ) -> SessionOutcome:
        """Compare with every baseline, write the report and chart, save the record if asked.

        ``update_record(record_dict)`` and ``update_report(report_dict)`` are the plugin hooks.
        ``incomplete``: why the session did not run every selected test to a pass (None when it
        did); the report then says ``"passed": false`` and no baseline is saved."""
        run = self.build_record()
        if update_record is not None:  # a hook may add metadata; the result must still be valid
            data = record_to_dict(run)
            update_record(data)
            run = record_from_dict(data, source="the run record after pytest_rlbench_update_run_record")
        results = compare_all(run, baselines, tolerance, self.verdicts)
        findings = [f for b in baselines for f in check_record(b)]
        outcome = SessionOutcome(run, results, findings, step_breakdown=list(self.step_breakdown))
        if save_path is not None and incomplete is not None:
            outcome.problems.append(f"baseline not saved to {str(save_path)!r}: {incomplete}")
        elif save_path is not None:
            saved = pooled_baseline(run, save_path, tolerance)
            if saved is not run:
                sessions = max((pooled_sessions(saved, p) for p in saved.phases), default=1)
                outcome.notes.append(
                    f"baseline {str(save_path)!r}: the same work on this machine was saved there before; its "
                    f"timing blocks are kept with this session's ({sessions} sessions, at most {POOLED_SESSIONS}), "
                    "and a gate reads their median block"
                )
            _write(outcome, "the baseline", save_path, lambda p: save_record(saved, p))
        if report_path is not None:
            report = build_report(run, results, findings, {"step_breakdown": self.step_breakdown})
            if incomplete is not None:
                report["passed"] = False
            if update_report is not None:  # a hook may add sections to the report
                update_report(report)
            _write(outcome, "the JSON report", report_path, lambda p: write_text_atomic(p, dumps_report(report)))
            chart = chart_path_for(report_path)
            empty = nothing_to_draw(run, baselines, self.step_breakdown)
            if self.phases and empty is not None:  # e.g. save_checkpoint alone: it runs outside the step
                outcome.notes.append(f"no chart {str(chart)!r}: {empty}")
            elif self.phases:  # the chart is the step's time by phase: nothing to draw without a timed phase
                draw = lambda t: write_chart(t, run, baselines, results=results, step_breakdown=self.step_breakdown)  # noqa: E731
                _write(outcome, "the chart", chart, lambda p: write_atomic(p, draw))
        return outcome


def pooled_baseline(run: RunRecord, path: Path, tolerance: float) -> RunRecord:
    """The record to save as a baseline at ``path``: on CPU workers, where ``path`` already holds a
    baseline of the same work on this machine (one it would gate), ``run`` with that baseline's blocks
    of rounds kept too (``retiming.with_earlier_sessions``); else ``run`` itself (the file is replaced)."""
    if run.hardware.device != "cpu" or not path.is_file():
        return run
    try:
        earlier = load_record(path)
    except BaselineError:
        return run  # not a baseline we can read: replaced, as any other file there
    same = compare(run, earlier, tolerance)
    if same.mode != "gate" or same.basis != SAME_MACHINE:
        return run
    return with_earlier_sessions(run, earlier)


def mismatch_failure(rounds: list[Mapping[str, float]], limit: float | None) -> str | None:
    """Why the step rounds break --rl-max-mismatch (their worst token_mult_prob_error above ``limit``);
    None when within it, without a limit, or when no round reported the figure."""
    values = [r[MISMATCH_METRIC] for r in rounds if MISMATCH_METRIC in r]
    if limit is None or not values or max(values) <= limit:
        return None
    return (
        f"{MISMATCH_METRIC} {max(values):.6g} exceeds --rl-max-mismatch {limit:g} (rounds: "
        f"{', '.join(f'{v:.6g}' for v in values)}): the rollout engine's token log-probs differ from the trainer's"
    )


def _write(outcome: SessionOutcome, what: str, path: Path, write: Any) -> None:
    """Write one output; a failure becomes one line in ``outcome.problems`` and stops nothing else."""
    try:
        outcome.written.append(write(path))
    except Exception as exc:  # any failure (disk, a chart that cannot be drawn): the others still go out
        outcome.problems.append(failure_line(what, path, exc))
        outcome.write_failed = True


class Recorders:
    """One recorder per --rl-trainer framework (a record is one framework's run), and the active one:
    the ``rl_trainer`` fixture activates a framework's recorder when it builds that framework's trainer,
    and pytest builds one trainer at a time, so the active recorder is always the live trainer's."""

    def __init__(self, names: dict[str, str], code_dir: Path) -> None:
        self.by_framework = {key: BenchRecorder(name, code_dir) for key, name in names.items()}
        self.active = self.by_framework[next(iter(names))]

    def activate(self, framework: str) -> BenchRecorder:
        self.active = self.by_framework[framework]
        return self.active

    def of_benchmark(self, nodeid: str) -> BenchRecorder | None:
        """The recorder into which the benchmark ``nodeid`` recorded its phase, if it did."""
        return next((r for r in self.by_framework.values() if nodeid in r.sources.values()), None)


RECORDERS_KEY = pytest.StashKey[Recorders]()
OUTCOME_KEY = pytest.StashKey[SessionOutcome]()  # set at the session's end, read by the terminal summary


def install_recorders(config: pytest.Config, opts: RLBenchOptions) -> None:
    """One recorder per --rl-trainer framework, named after the saved baseline's file (the further
    frameworks' with their name appended); the first is active until a trainer is built."""
    name = opts.save_baseline.stem if opts.save_baseline else "this-run"
    names = {key: name if i == 0 else f"{name}-{key}" for i, key in enumerate(opts.trainers)}
    config.stash[RECORDERS_KEY] = Recorders(names, config.rootpath)


def get_recorder(config: pytest.Config) -> BenchRecorder:
    """The recorder the benchmarks record into now (the live trainer's framework's)."""
    return config.stash[RECORDERS_KEY].active
