"""The JSON report of a run: its metadata, every phase key with seconds and figures, the comparisons
with each baseline, and the consistency findings.

    {"format_version": 1, "passed": true,
     "run": {"name", "provenance", "hardware", "model", "config", "tokens", "workload" (when recorded)},
     "phases": {"gen": {"seconds": {"median", "min", "max", "samples"} | null,
                        "figures": {"tokens_per_s_per_gpu": {"value", "unit", "basis", "reason"}, ...}}, ...},
     "metrics": {name: {"value" (median), "unit", "samples"}},
     "baselines": [{"name", "source", "mode", "basis", "mismatches", "assumptions", "machines", "passed"}],
     "comparisons": [{"metric", "phase", "measured", "baseline", "source", "ratio", "tolerance",
                      "verdict", "reason", "message", "unit", "mode", "assumptions"}],
     "consistency": [{"record", "figure", "label", "published", "unit", "verdict", "detail",
                      "interpretations": [...]}]}

Every phase key (trainer.phases.PHASE_KEYS) is present under "phases", with "seconds": null where the run did not time it,
and "absent": the reason where its trainer cannot time it (a phase its framework does not separate),
and "inside_step": true where it was timed inside whole steps (their breakdown), not by a benchmark of its own.
A session of several frameworks (--rl-trainer ours --rl-trainer trl) adds "frameworks": each
framework's own report of this shape (pytest_rlbench.frameworks.session), the first one's also at the top.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from pytest_rlbench.records.metrics import TIMING
from pytest_rlbench.records.record import RunRecord, record_to_dict
from pytest_rlbench.verdict.compare import BaselineComparison
from pytest_rlbench.verdict.consistency import Finding
from pytest_rlbench.verdict.derived import Figure, derive
from trainer.phases import PHASE_KEYS

REPORT_FORMAT_VERSION = 1
RUN_SECTIONS: tuple[str, ...] = ("name", "provenance", "hardware", "model", "config", "tokens", "workload")


def _figure_json(fig: Figure) -> dict[str, Any]:
    return {"value": fig.value, "unit": fig.unit, "basis": fig.basis, "reason": fig.reason}


def phases_json(
    figures: dict[str, Figure], absent: dict[str, str] | None = None, inside_step: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Each phase key: its seconds (null when not timed) and its derived figures by family; a phase
    the trainer cannot time (``absent``: the record's provenance.absent_phases) says why under "absent";
    one timed inside whole steps rather than by a benchmark of its own has "inside_step": true."""
    out: dict[str, Any] = {}
    for key in PHASE_KEYS:
        timed = figures.get(f"{TIMING}/{key}")
        seconds = None
        if timed is not None:
            seconds = {"median": timed.value, "min": min(timed.samples), "max": max(timed.samples), "samples": list(timed.samples)}
        derived = {f.family: _figure_json(f) for f in figures.values() if f.phase == key and f.family != TIMING}
        out[key] = {"seconds": seconds, "figures": derived}
        if absent and key in absent:
            out[key]["absent"] = absent[key]
        if key in inside_step:
            out[key]["inside_step"] = True
    return out


def build_report(
    run: RunRecord,
    results: Sequence[BaselineComparison] = (),
    findings: Sequence[Finding] = (),
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The report as a JSON-ready dict; ``extra`` (e.g. from a plugin hook) is added under "extra"."""
    record = record_to_dict(run)
    figures = derive(run)
    report: dict[str, Any] = {
        "format_version": REPORT_FORMAT_VERSION,
        "passed": all(r.passed for r in results),
        "run": {k: record[k] for k in RUN_SECTIONS if k in record},
        "phases": phases_json(
            figures, run.provenance.absent_phases, frozenset(k for k, p in run.phases.items() if p.inside_step)
        ),
        "metrics": {
            name: {"value": figures[name].value, "unit": m.unit, "samples": m.value} for name, m in run.metrics.items()
        },
        "baselines": [
            {
                "name": r.baseline,
                "source": r.source,
                "mode": r.mode,
                "basis": r.basis,
                "mismatches": list(r.mismatches),
                "assumptions": list(r.assumptions),
                "machines": r.machines,
                "passed": r.passed,
            }
            for r in results
        ],
        "comparisons": [
            {
                "metric": c.metric,
                "phase": c.phase,
                "measured": c.measured,
                "baseline": c.baseline,
                "source": c.baseline_source,
                "ratio": c.ratio,
                "tolerance": c.tolerance,
                "verdict": c.verdict,
                "reason": c.reason,
                "message": c.message,
                "unit": c.unit,
                "mode": r.mode,
                "assumptions": list(c.assumptions),
            }
            for r in results
            for c in r.comparisons
        ],
        "consistency": [asdict(f) for f in findings],
    }
    if extra:
        report["extra"] = extra
    return report
