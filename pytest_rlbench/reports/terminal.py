"""The terminal summary: plain text lines, for the plugin to write through its terminal reporter.

The first lines answer the run's question (``reports/answer.py``): PASS or FAIL per gating baseline,
or with no gate the command that would gate this work; then the run's efficiency where a peak of its
device is known. Then each gate under a heading that names the baseline, its source and its count of
verdicts, with one short line per judged figure (``reports/verdict_lines.py``: the verdict, the
values, the ratio against its threshold, the reason in a few words); a gate on the same per-GPU work
as a published baseline says what it gates (per-GPU throughput, or efficiency across GPU models) and
lists, beside its verdicts, every assumed value it rests on. A gate's heading counts its judged
figures (one per measurement: the rows listed beside them have no verdict of their own, and show
with ``verbose``, as does each verdict's whole message: p-values, pace, clocks, CPU use).

A reference (other work or other hardware) is no gate: one line naming the kinds of difference. With
``verbose``: every difference, and what carries across work: per-token cost (milliseconds of one
device per thousand tokens, the inverse of throughput per device: a GPU, or a worker on a CPU run),
MFU and memory-bandwidth use, side by side with no ratio, since seconds of different work do not
divide into a speed-up; of another model, the baseline's figures alone, never beside this run's.

With no gate, this run's own times (``run_lines``; pytest-benchmark's table is off unless asked for).
Before the tables, the rollout panel's table when more than one engine ran (each engine's tokens/s and
fidelity on the same prompts and seed). With ``verbose``, the consistency findings of the baselines
compared, one sentence each. Last, unless ``verbose`` showed them, where the whole verdicts of the
failures and the inconclusive ones are: ``-v`` and the JSON report (which keeps every message).
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
    TIMING,
    TOKENS_PER_S,
    family_of,
    format_value,
    panel_metric,
)
from pytest_rlbench.records.record import RunRecord
from pytest_rlbench.reports.answer import gate_status
from pytest_rlbench.reports.verdict_lines import block_widths, short_verdict
from pytest_rlbench.verdict.compare import BaselineComparison, Comparison
from pytest_rlbench.verdict.consistency import Finding, finding_sentence
from pytest_rlbench.verdict.derived import derive
from pytest_rlbench.verdict.gate_basis import SAME_MACHINE
from trainer.phases import PHASE_KEYS

# A reference's rows: the families that carry across different work, and how each is shown.
PER_TOKEN_COST = "ms per 1k tokens per device"
REFERENCE_SHOWN: dict[str, str] = {THROUGHPUT: PER_TOKEN_COST, MFU: "MFU", BANDWIDTH: "bandwidth use"}
# How the heading of a reference names the kinds of difference (the mismatch key's prefix).
DIFFERENCE_KINDS: dict[str, str] = {"hardware": "hardware", "config": "work per step", "model": "model"}


def _table(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def _differences_in_words(mismatches: Sequence[str], names: bool = True) -> str:
    """ "hardware (device, world_size), work per step (train_batch_size) and model", from mismatch
    lines; the kinds alone ("hardware, work per step and model") without ``names``."""
    kinds: dict[str, list[str]] = {}
    for line in mismatches:
        key = line.split(":", 1)[0]
        prefix, _, name = key.partition(".")
        kind = DIFFERENCE_KINDS.get(prefix, "work per GPU")
        fields = kinds.setdefault(kind, [])
        field = name or (key if kind == "work per GPU" else "")
        if field and field not in fields:
            fields.append(field)
    parts = [f"{kind} ({', '.join(fields)})" if fields and names else kind for kind, fields in kinds.items()]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def other_model(result: BaselineComparison) -> bool:
    """Whether the baseline ran another model: its figures are then never set beside this run's."""
    return any(line.startswith("model:") for line in result.mismatches)


def _per_token_cost(tokens_per_s_per_gpu: float | None) -> str:
    # device-seconds per token x 1e6: device-milliseconds per thousand tokens.
    return "-" if not tokens_per_s_per_gpu else format_value(1e6 / tokens_per_s_per_gpu, "")


def _reference_row(c: Comparison, beside: bool) -> list[str] | None:
    """The baseline's figure, after this run's when ``beside``; None for a row that does not carry across."""
    family = family_of(c.metric)
    if family not in REFERENCE_SHOWN or (c.baseline is None and (c.measured is None or not beside)):
        return None
    if family == THROUGHPUT:
        cells = [_per_token_cost(c.measured), _per_token_cost(c.baseline)]
    else:
        cells = [format_value(c.measured, c.unit), format_value(c.baseline, c.unit)]
    return [c.phase or "-", REFERENCE_SHOWN[family], *(cells if beside else cells[1:])]


def reference_lines(result: BaselineComparison, verbose: bool = False) -> list[str]:
    """A baseline that is a reference only: one line, or with ``verbose`` its heading, every
    difference and its figures (see the module docstring)."""
    if not verbose:
        n = len(result.mismatches)
        return [
            f"reference '{result.baseline}': differs in {_differences_in_words(result.mismatches, names=False)} "
            f"(-v shows its figures and {n} difference{'s' if n != 1 else ''})"
        ]
    lines = [f"baseline '{result.baseline}' ({result.source}): reference, not a gate", "  it differs in:"]
    lines += [f"    - {line}" for line in result.mismatches]
    beside = not other_model(result)
    rows = [row for c in result.comparisons if (row := _reference_row(c, beside)) is not None]
    if not rows:
        return lines + ["  (no figure that carries across different work)"]
    if not beside:
        lines.append("  its figures (another model: not comparable with this run's):")
        return lines + _table([["phase", "figure", "baseline"], *rows])
    return lines + _table([["phase", "figure (carries across work)", "this run", "baseline"], *rows])


def verdict_block(comparisons: Sequence[Comparison], verbose: bool = False) -> list[str]:
    """One short line per judged figure, aligned (``reports/verdict_lines.py``); a phase that did not
    run once. With ``verbose``, the rows listed beside the judged ones too, and under each line its
    whole message: the rank test, the pace, the clocks, the CPU used."""
    shown: list[Comparison] = []
    for c in comparisons:
        if c.verdict == "reference" and not verbose:
            continue  # listed beside its phase's gated figure: -v
        if c.verdict == "not run" and any(s.verdict == "not run" and s.phase == c.phase for s in shown):
            continue  # one line per phase that did not run
        shown.append(c)
    widths = block_widths(shown)
    lines = []
    for c in shown:
        lines.append(f"  {short_verdict(c, widths)}")
        if verbose:
            lines.append(f"      {c.message}")
    return lines


def comparison_lines(result: BaselineComparison, verbose: bool = False) -> list[str]:
    """The heading and verdict lines of one baseline."""
    if result.mode != "gate":
        return reference_lines(result, verbose)
    lines = [f"baseline '{result.baseline}' ({result.source}): gate, {gate_status(result)}"]
    if result.basis and result.basis != SAME_MACHINE:
        lines.append(f"  gated on {result.basis}")
    if result.machines:
        lines.append(f"  on {result.machines}")
    if result.assumptions:
        lines.append(f"  rests on {len(result.assumptions)} assumed value(s):")
        lines += [f"    - {line}" for line in result.assumptions]
    if not result.comparisons:
        return lines + ["  (no metric in common)"]
    return lines + verdict_block(result.comparisons, verbose)


def details_line(results: Sequence[BaselineComparison], verbose: bool, report: str | None) -> list[str]:
    """Where the whole verdicts of the failures and inconclusive ones are, unless shown (``verbose``)."""
    failed = sum(len(r.failures) for r in results)
    unsure = sum(len(r.inconclusive) for r in results)
    if verbose or not (failed or unsure):
        return []
    counts = [f"{failed} regression(s)"] if failed else []
    counts += [f"{unsure} inconclusive (not a failure)"] if unsure else []
    where = f"in the JSON report {report}" if report else "in a JSON report with --rl-report PATH"
    return [f"{', '.join(counts)}: the whole verdicts (p-values, pace, clocks, CPU use) with -v and {where}"]


def finding_lines(
    findings: Sequence[Finding], verbose: bool = False, compared: Sequence[str] | None = None
) -> list[str]:
    """With ``verbose``, the consistency findings of the baselines ``compared`` (every one when None),
    one sentence each with how each reading came out; nothing otherwise: they are about the
    baselines' published figures, not this run."""
    shown = [f for f in findings if compared is None or f.record in compared]
    if not verbose or not shown:
        return []
    lines = ["consistency of the baselines' published figures:"]
    for f in shown:
        lines += [f"  {finding_sentence(f)}", f"      ({f.detail})"]
    return lines


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


def run_lines(run: RunRecord, hint: str = "") -> list[str]:
    """This run's own times, seconds over its timed rounds, and tokens/s per device where counted;
    ``hint`` says how to bring back pytest-benchmark's table."""
    figures = derive(run)
    rows = [["phase", "median", "min", "max", "rounds", "tokens/s per device"]]
    for phase in PHASE_KEYS:
        timed = figures.get(f"{TIMING}/{phase}")
        if timed is None or timed.value is None:
            continue
        samples = timed.samples or (timed.value,)
        speed = figures.get(f"{THROUGHPUT}/{phase}")
        cells = [format_value(v, "") for v in (timed.value, min(samples), max(samples))]
        rows.append([phase, *cells, str(len(samples)), format_value(speed.value if speed else None, "")])
    if len(rows) == 1:
        return []
    return [f"this run, seconds per round{f' ({hint})' if hint else ''}:", *_table(rows)]


def terminal_lines(
    results: Sequence[BaselineComparison],
    findings: Sequence[Finding] = (),
    verbose: bool = False,
    run: RunRecord | None = None,
    report: str | None = None,
) -> list[str]:
    """The summary after its answer (``reports/answer.py``), as lines of text (no trailing newlines):
    each gate's verdict lines, a line per reference, the findings (``verbose``), and where the whole
    verdicts are (``report``: the JSON report's path, if written); ``run`` names its framework."""
    lines = framework_lines(run) + panel_lines(run)
    for result in sorted(results, key=lambda r: r.mode != "gate"):  # the gates first
        lines += comparison_lines(result, verbose)
    lines += finding_lines(findings, verbose, [r.baseline for r in results])
    return lines + details_line(results, verbose, report)
