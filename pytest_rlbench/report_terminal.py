"""The terminal summary: plain text lines, for the plugin to write through its terminal reporter.

One table per baseline (phase, metric, measured, baseline, ratio, tolerance, verdict) under a heading
that names the baseline, its source and whether it is a gate; a reference's heading says why it is not
a gate. A gate on the same per-GPU work as a published baseline says what it gates (per-GPU throughput,
or efficiency across GPU models) and lists, beside its verdicts, every assumed value it rests on.
Then the consistency findings (only the disagreements unless ``verbose``) and the failures, one
message each.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_rlbench.compare import BaselineComparison, Comparison
from pytest_rlbench.consistency import Finding
from pytest_rlbench.frameworks import OURS_LABEL
from pytest_rlbench.gate_basis import SAME_MACHINE
from pytest_rlbench.metrics import family_label, format_value
from pytest_rlbench.record import RunRecord

MAX_MISMATCHES_SHOWN = 3


def _table(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def _verdict_cell(c: Comparison) -> str:
    if c.verdict == "fail":
        return f"FAIL ({c.reason})"
    if c.verdict == "pass":
        return "pass" if c.reason == "within tolerance" else f"pass ({c.reason})"
    return "missing" if c.reason == "missing" else "reference"


def _row(c: Comparison, gate: bool) -> list[str]:
    ratio = f"{c.ratio:.2f}" if c.ratio is not None else "-"
    cells = [c.phase or "-", family_label(c.metric), format_value(c.measured, c.unit), format_value(c.baseline, c.unit), ratio]
    return cells + ([f"{c.tolerance:.2f}"] if gate else []) + [_verdict_cell(c)]


def comparison_lines(result: BaselineComparison) -> list[str]:
    """The heading and table of one baseline."""
    gate = result.mode == "gate"
    if gate:
        failed = len(result.failures)
        status = f"gate, {failed} of {len(result.comparisons)} failed" if failed else f"gate, all {len(result.comparisons)} passed"
        lines = [f"baseline '{result.baseline}' ({result.source}): {status}"]
        if result.basis and result.basis != SAME_MACHINE:
            lines.append(f"  gated on {result.basis}")
        if result.assumptions:
            lines.append(f"  rests on {len(result.assumptions)} assumed value(s):")
            lines += [f"    - {line}" for line in result.assumptions]
    else:
        shown = "; ".join(result.mismatches[:MAX_MISMATCHES_SHOWN])
        more = len(result.mismatches) - MAX_MISMATCHES_SHOWN
        lines = [
            f"baseline '{result.baseline}' ({result.source}): reference, not a gate",
            f"  different work or hardware: {shown}" + (f" (+{more} more)" if more > 0 else ""),
        ]
    if not result.comparisons:
        return lines + ["  (no metric in common)"]
    header = ["phase", "metric", "measured", "baseline", "ratio"] + (["tol"] if gate else []) + ["verdict"]
    return lines + _table([header] + [_row(c, gate) for c in result.comparisons])


def finding_lines(findings: Sequence[Finding], verbose: bool = False) -> list[str]:
    """Consistency findings: the disagreements (every finding if ``verbose``), and a count of the rest."""
    shown = [f for f in findings if verbose or not f.ok]
    lines = []
    for f in shown:
        lines.append(f"  {f.record}: {f.label} {f.published:g} {f.unit}: {f.verdict}")
        lines.append(f"      {f.detail}")
    hidden = len(findings) - len(shown)
    if hidden:
        lines.append(f"  {hidden} other check(s) consistent")
    return (["consistency of the baselines' published figures:"] + lines) if findings else []


def framework_lines(run: RunRecord | None) -> list[str]:
    """Which framework's trainer produced the figures, and the settings it could not be given;
    nothing for the bundled trainer with nothing to list."""
    if run is None or (run.provenance.framework == OURS_LABEL and not run.provenance.differences):
        return []
    differences = run.provenance.differences or []
    lines = [f"framework: {run.provenance.framework}" + (", settings not made equal:" if differences else "")]
    return lines + [f"  - {line}" for line in differences]


def terminal_lines(
    results: Sequence[BaselineComparison],
    findings: Sequence[Finding] = (),
    verbose: bool = False,
    run: RunRecord | None = None,
) -> list[str]:
    """The whole summary as lines of text (no trailing newlines); ``run`` names its framework."""
    lines = framework_lines(run)
    for result in results:
        lines += comparison_lines(result)
    lines += finding_lines(findings, verbose)
    failures = [c for r in results for c in r.failures]
    if failures:
        lines.append(f"{len(failures)} regression(s):")
        lines += [f"  {c.message}" for c in failures]
    return lines
