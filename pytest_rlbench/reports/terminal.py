"""The terminal summary: plain text lines, for the plugin to write through its terminal reporter.

One table per baseline under a heading that names the baseline, its source and whether it is a gate.
A gate's table has phase, metric, measured, baseline, ratio, tolerance and verdict; a gate on the same
per-GPU work as a published baseline says what it gates (per-GPU throughput, or efficiency across GPU
models) and lists, beside its verdicts, every assumed value it rests on.

A reference (other work or other hardware) is no gate, and its table shows only what carries across
work: per-token cost (milliseconds of one device per thousand tokens, the inverse of throughput per
device: a GPU, or a worker on a CPU run), MFU and
memory-bandwidth use, side by side with no ratio, since seconds of different work do not divide into
a speed-up. Its heading says in words how it differs (every difference with ``verbose``).
A gate's heading counts its judged figures (one per measurement: the rows listed beside them have
no verdict of their own). Before the tables, the rollout panel's table when more than one engine ran
(each engine's tokens/s and fidelity on the same prompts and seed). Then the consistency findings, one
sentence each (only the disagreements unless ``verbose``), the failures and the inconclusive
verdicts, one message each.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from pytest_rlbench.frameworks import OURS_LABEL
from pytest_rlbench.records.metrics import (
    BANDWIDTH,
    MFU,
    PANEL,
    THROUGHPUT,
    TOKENS_PER_S,
    family_label,
    family_of,
    format_value,
    panel_metric,
)
from pytest_rlbench.records.record import RunRecord
from pytest_rlbench.verdict.compare import JUDGED, BaselineComparison, Comparison
from pytest_rlbench.verdict.consistency import Finding, finding_sentence
from pytest_rlbench.verdict.gate_basis import SAME_MACHINE

# A reference's rows: the families that carry across different work, and how each is shown.
PER_TOKEN_COST = "ms per 1k tokens per device"
REFERENCE_SHOWN: dict[str, str] = {THROUGHPUT: PER_TOKEN_COST, MFU: "MFU", BANDWIDTH: "bandwidth use"}
# How the heading of a reference names the kinds of difference (the mismatch key's prefix).
DIFFERENCE_KINDS: dict[str, str] = {"hardware": "hardware", "config": "work per step", "model": "model"}


def _table(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def _verdict_cell(c: Comparison) -> str:
    if c.verdict == "fail":
        return f"FAIL ({c.reason})"
    if c.verdict == "pass":
        return "pass" if c.reason == "within tolerance" else f"pass ({c.reason})"
    if c.verdict == "not run":
        return "not run"
    if c.verdict == "inconclusive":
        return f"inconclusive ({c.reason})"
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


def _gate_row(c: Comparison) -> list[str]:
    ratio = f"{c.ratio:.2f}" if c.ratio is not None else "-"
    cells = [c.phase or "-", family_label(c.metric), format_value(c.measured, c.unit), format_value(c.baseline, c.unit), ratio]
    return cells + [f"{c.tolerance:.2f}", _verdict_cell(c)]


def _differences_in_words(mismatches: Sequence[str]) -> str:
    """"hardware (device, world_size), work per step (train_batch_size) and model", from mismatch lines."""
    kinds: dict[str, list[str]] = {}
    for line in mismatches:
        key = line.split(":", 1)[0]
        prefix, _, name = key.partition(".")
        kind = DIFFERENCE_KINDS.get(prefix, "work per GPU")
        names = kinds.setdefault(kind, [])
        field = name or (key if kind == "work per GPU" else "")
        if field and field not in names:
            names.append(field)
    parts = [f"{kind} ({', '.join(names)})" if names else kind for kind, names in kinds.items()]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _per_token_cost(tokens_per_s_per_gpu: float | None) -> str:
    # device-seconds per token x 1e6: device-milliseconds per thousand tokens.
    return "-" if not tokens_per_s_per_gpu else format_value(1e6 / tokens_per_s_per_gpu, "")


def _reference_row(c: Comparison) -> list[str] | None:
    """This run's and the baseline's figure side by side, or None for a row that does not carry across."""
    family = family_of(c.metric)
    if family not in REFERENCE_SHOWN or (c.measured is None and c.baseline is None):
        return None
    if family == THROUGHPUT:
        return [c.phase or "-", PER_TOKEN_COST, _per_token_cost(c.measured), _per_token_cost(c.baseline)]
    return [c.phase or "-", REFERENCE_SHOWN[family], format_value(c.measured, c.unit), format_value(c.baseline, c.unit)]


def reference_lines(result: BaselineComparison, verbose: bool = False) -> list[str]:
    """The heading and table of a baseline that is a reference only (see the module docstring)."""
    lines = [
        f"baseline '{result.baseline}' ({result.source}): reference, not a gate",
        f"  it differs in {_differences_in_words(result.mismatches)}"
        + (":" if verbose else f" ({len(result.mismatches)} difference(s); -v lists them)"),
    ]
    if verbose:
        lines += [f"    - {line}" for line in result.mismatches]
    rows = [row for c in result.comparisons if (row := _reference_row(c)) is not None]
    if not rows:
        return lines + ["  (no figure that carries across different work)"]
    header = ["phase", "figure (carries across work)", "this run", "baseline"]
    return lines + _table([header] + rows)


def comparison_lines(result: BaselineComparison, verbose: bool = False) -> list[str]:
    """The heading and table of one baseline."""
    if result.mode != "gate":
        return reference_lines(result, verbose)
    lines = [f"baseline '{result.baseline}' ({result.source}): {_gate_status(result)}"]
    if result.basis and result.basis != SAME_MACHINE:
        lines.append(f"  gated on {result.basis}")
    if result.assumptions:
        lines.append(f"  rests on {len(result.assumptions)} assumed value(s):")
        lines += [f"    - {line}" for line in result.assumptions]
    if not result.comparisons:
        return lines + ["  (no metric in common)"]
    header = ["phase", "metric", "measured", "baseline", "ratio", "tol", "verdict"]
    return lines + _table([header] + [_gate_row(c) for c in result.comparisons])


def finding_lines(findings: Sequence[Finding], verbose: bool = False) -> list[str]:
    """Consistency findings, one sentence each: the disagreements (every finding, with how each reading
    came out, if ``verbose``), and a count of the rest."""
    shown = [f for f in findings if verbose or not f.ok]
    lines = []
    for f in shown:
        lines.append(f"  {finding_sentence(f)}")
        if verbose:
            lines.append(f"      ({f.detail})")
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


def panel_engines(run: RunRecord) -> list[str]:
    """The engines the run's panel measured, in the order they ran (empty without a panel)."""
    return list(run.config.settings.get(PANEL, []))


def panel_figure(run: RunRecord, engine: str, figure: str) -> float | None:
    """One engine's figure at its median, or None when the run has none."""
    metric = run.metrics.get(panel_metric(engine, figure))
    return statistics.median(metric.value) if metric is not None and metric.value else None


def panel_lines(run: RunRecord | None) -> list[str]:
    """The rollout panel's table (pytest_rlbench/session/rollout_panel.py): each engine's tokens/s and fidelity
    on the same prompts and seed, the session's engine (which trained) first; nothing without a panel."""
    engines = panel_engines(run) if run is not None else []
    if run is None or not engines:
        return []
    rows = [["engine", "tokens/s", "token_mult_prob_error", "mismatch_kl"]]
    for engine in engines:
        label = f"{engine} (trains)" if engine == run.config.settings.get("rollout") else engine
        speed = format_value(panel_figure(run, engine, TOKENS_PER_S), "")
        # fidelity near its ideal (1 and 0): six significant digits, or the gap would not show
        fidelity = [panel_figure(run, engine, figure) for figure in ("token_mult_prob_error", "mismatch_kl")]
        rows.append([label, speed, *("-" if v is None else f"{v:.6g}" for v in fidelity)])
    return ["rollout engines, same prompts and seed:", *_table(rows)]


def terminal_lines(
    results: Sequence[BaselineComparison],
    findings: Sequence[Finding] = (),
    verbose: bool = False,
    run: RunRecord | None = None,
) -> list[str]:
    """The whole summary as lines of text (no trailing newlines); ``run`` names its framework."""
    lines = framework_lines(run) + panel_lines(run)
    for result in results:
        lines += comparison_lines(result, verbose)
    lines += finding_lines(findings, verbose)
    failures = [c for r in results for c in r.failures]
    if failures:
        lines.append(f"{len(failures)} regression(s):")
        lines += [f"  {c.message}" for c in failures]
    unsure = [c for r in results for c in r.inconclusive]
    if unsure:
        lines.append(f"{len(unsure)} inconclusive (past tolerance, but this session cannot tell whether it is real; not a failure):")
        lines += [f"  {c.message}" for c in unsure]
    return lines
