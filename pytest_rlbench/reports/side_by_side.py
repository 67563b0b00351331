"""The terminal's view of a session that ran several frameworks (``--rl-trainer ours --rl-trainer trl``).

First one table, the frameworks side by side phase by phase: each phase's benchmark time (median of
its rounds), its time inside the whole step (median of the step rounds' own timing, as VERL logs it),
tokens/s per GPU and MFU (``pytest_rlbench.verdict.derived``). A phase a framework does not separate reads
"absent" (the record's ``provenance.absent_phases``), one it could have timed but did not run "-".
Then each framework's settings not made equal and its comparisons with the baselines, under a
heading naming it; the consistency findings of the baselines once, at the end (with ``verbose``).
Either way the summary opens with its answer (``reports/answer.py``) and the session's notes.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from pytest_rlbench.records.metrics import MFU, THROUGHPUT, TIMING, format_value
from pytest_rlbench.reports.answer import Invocation, answer_lines
from pytest_rlbench.reports.terminal import (  # one table format
    _table,
    finding_lines,
    run_lines,
    terminal_lines,
)
from pytest_rlbench.verdict.derived import Figure, derive
from trainer.phases import PHASE_KEYS

if TYPE_CHECKING:
    from pytest_rlbench.records.record import RunRecord
    from pytest_rlbench.verdict.compare import BaselineComparison
    from pytest_rlbench.verdict.consistency import Finding

ABSENT = "absent"
# (figure as the table names it, metric family); "in step" is read from the step rounds instead
FIGURES: tuple[tuple[str, str], ...] = (
    ("time", TIMING),
    ("time in step", ""),
    ("tokens/s per GPU", THROUGHPUT),
    ("MFU", MFU),
)


def step_seconds(breakdown: Sequence[dict[str, float]], phase: str) -> float | None:
    """The median of ``phase``'s own seconds over the whole-step rounds that timed it, or None."""
    values = [r[phase] for r in breakdown if phase in r]
    return statistics.median(values) if values else None


def _cell(
    run: RunRecord, figures: dict[str, Figure], breakdown: Sequence[dict[str, float]], phase: str, family: str
) -> str:
    if phase in (run.provenance.absent_phases or {}):
        return ABSENT
    if not family:
        return format_value(step_seconds(breakdown, phase), "s")
    figure = figures.get(f"{family}/{phase}")
    return "-" if figure is None else format_value(figure.value, figure.unit)


def framework_rows(runs: Sequence[tuple[RunRecord, Sequence[dict[str, float]]]]) -> list[list[str]]:
    """The side-by-side table (header first): one row per phase and figure that any framework has,
    one column per framework; a row with nothing in any column is left out."""
    header = ["phase", "figure", *(run.provenance.framework or "?" for run, _ in runs)]
    derived = [derive(run) for run, _ in runs]
    rows = [header]
    for phase in PHASE_KEYS:
        for label, family in FIGURES:
            cells = [
                _cell(run, figs, steps, phase, family)
                for (run, steps), figs in zip(runs, derived, strict=True)
            ]
            if any(c not in ("-", ABSENT) for c in cells) or (family == TIMING and ABSENT in cells):
                rows.append([phase, label, *cells])
    return rows


class FrameworkOutcome(Protocol):
    """One framework's end of session, as the summary reads it (``session.recorder.SessionOutcome``)."""

    run: RunRecord
    results: Sequence[BaselineComparison]
    step_breakdown: Sequence[dict[str, float]]


def session_lines(
    outcomes: Sequence[FrameworkOutcome],
    findings: Sequence[Finding] = (),
    verbose: bool = False,
    baselines: Sequence[RunRecord] = (),
    invocation: Invocation | None = None,
    notes: Sequence[str] = (),
    table_hint: str = "",
    report: str | None = None,
) -> list[str]:
    """The terminal summary of a session: first its answer (each gate's PASS or FAIL, or the command
    that would gate this work, over ``baselines``, from ``invocation``), then ``notes``; with one
    framework, its own times when nothing gated them (``table_hint``: how to bring back pytest-benchmark's
    table) and ``terminal_lines``; with several, the frameworks side by side, then each framework's
    own summary under its name. ``findings``: the consistency findings on the baselines, shown once;
    ``report``: the JSON report's path, which keeps each verdict's whole message."""
    lines = answer_lines([(o.run, o.results) for o in outcomes], baselines, invocation) + list(notes)
    if len(outcomes) == 1:
        o = outcomes[0]
        gated = any(r.mode == "gate" for r in o.results)
        return (
            lines
            + ([] if gated else run_lines(o.run, table_hint))
            + terminal_lines(o.results, findings, verbose, o.run, report)
        )
    lines.append("frameworks side by side (same model, data, reward and batch):")
    lines += _table(framework_rows([(o.run, o.step_breakdown) for o in outcomes]))
    for o in outcomes:
        lines.append(f"{o.run.provenance.framework} (record '{o.run.name}'):")
        own = terminal_lines(o.results, (), verbose, o.run, report)
        lines += ["  " + line for line in own] or ["  (no baseline)"]
    compared = [r.baseline for o in outcomes for r in o.results]
    return lines + finding_lines(findings, verbose, compared)
