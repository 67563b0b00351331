"""The terminal summary: plain text lines, for the plugin to write through its terminal reporter.

One table per baseline (phase, metric, measured, baseline, ratio, tolerance, verdict) under a heading
that names the baseline, its source and whether it is a gate; a reference's heading says why it is not
a gate. A gate on the same per-GPU work as a published baseline says what it gates (per-GPU throughput,
or efficiency across GPU models) and lists, beside its verdicts, every assumed value it rests on.
A gate's heading counts its judged figures (one per measurement: the rows listed beside them have
no verdict of their own). Then the consistency findings (only the disagreements unless ``verbose``),
the failures and the inconclusive verdicts, one message each.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_rlbench.compare import JUDGED, BaselineComparison, Comparison
from pytest_rlbench.consistency import Finding
from pytest_rlbench.gate_basis import SAME_MACHINE
from pytest_rlbench.metrics import family_label, format_value

MAX_MISMATCHES_SHOWN = 3


def _table(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def _verdict_cell(c: Comparison) -> str:
    if c.verdict == "fail":
        return f"FAIL ({c.reason})"
    if c.verdict == "pass":
        return "pass" if c.reason == "within tolerance" else f"pass ({c.reason})"
    if c.verdict in ("inconclusive", "not run"):
        return c.verdict if c.verdict == "not run" else f"inconclusive ({c.reason})"
    return "missing" if c.reason == "missing" else "reference"


def _gate_status(result: BaselineComparison) -> str:
    """"gate, 1 of 6 failed, 2 inconclusive, 3 phases not run": figures counted if judged, phases if not run."""
    judged = sum(c.verdict in JUDGED for c in result.comparisons)
    failed, unsure = len(result.failures), len(result.inconclusive)
    passed = judged - failed - unsure
    status = f"{failed} of {judged} failed" if failed else f"all {judged} passed" if not unsure else f"{passed} of {judged} passed"
    not_run = len({c.phase for c in result.comparisons if c.verdict == "not run"})
    phases = f", {not_run} phase{'s' if not_run > 1 else ''} not run" if not_run else ""
    return f"gate, {status}" + (f", {unsure} inconclusive" if unsure else "") + phases


def _row(c: Comparison, gate: bool) -> list[str]:
    ratio = f"{c.ratio:.2f}" if c.ratio is not None else "-"
    cells = [c.phase or "-", family_label(c.metric), format_value(c.measured, c.unit), format_value(c.baseline, c.unit), ratio]
    return cells + ([f"{c.tolerance:.2f}"] if gate else []) + [_verdict_cell(c)]


def comparison_lines(result: BaselineComparison) -> list[str]:
    """The heading and table of one baseline."""
    gate = result.mode == "gate"
    if gate:
        lines = [f"baseline '{result.baseline}' ({result.source}): {_gate_status(result)}"]
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


def terminal_lines(
    results: Sequence[BaselineComparison], findings: Sequence[Finding] = (), verbose: bool = False
) -> list[str]:
    """The whole summary as lines of text (no trailing newlines)."""
    lines = []
    for result in results:
        lines += comparison_lines(result)
    lines += finding_lines(findings, verbose)
    failures = [c for r in results for c in r.failures]
    if failures:
        lines.append(f"{len(failures)} regression(s):")
        lines += [f"  {c.message}" for c in failures]
    unsure = [c for r in results for c in r.inconclusive]
    if unsure:
        lines.append(f"{len(unsure)} inconclusive (past tolerance, too few rounds to tell; not a failure):")
        lines += [f"  {c.message}" for c in unsure]
    return lines
