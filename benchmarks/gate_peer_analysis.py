"""What a verdict judged against the session's other phases would decide: an analysis of sessions kept
by ``benchmarks/gate_error_rates.py`` (its work directory), not the gate's verdict.

On the 2-core CI VM whole sessions drift: every phase of a later session may run 1.1-1.3x slower
than the session that saved the baseline (docs/benchmarks.md, "The gate's error rates"). A slowdown
of one phase moves that phase alone. So each phase's rounds are divided by its "peer factor", the
median over the session's other phases (of at least ``--min-seconds`` in the baseline) of their
plain ratio to the baseline, and judged by the gate's own rules (tolerance, noise floor, rank test).
A phase counts as failed only when it fails both in plain seconds and against its peers; one that
fails in plain seconds alone is "inconclusive" (every phase slower: the machine, or a change that
slows everything, which one session cannot tell apart). It needs the whole session, so as it stands
it could only judge at the end of a session, not in each phase's own test.

    python benchmarks/gate_peer_analysis.py WORKDIR [--tolerance 0.20] [--min-seconds 0.05]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gate_error_rates import record_of_report  # noqa: E402

from pytest_rlbench.compare import compare  # noqa: E402
from pytest_rlbench.metrics import TIMING  # noqa: E402
from pytest_rlbench.record import RunRecord, load_record  # noqa: E402


def plain_ratios(report: dict, base: RunRecord, min_seconds: float) -> dict[str, float]:
    """Each phase's median seconds over the baseline's, for phases of at least ``min_seconds`` there."""
    out = {}
    for phase, row in report["phases"].items():
        if not row.get("seconds") or phase not in base.phases:
            continue
        theirs = statistics.median(base.phases[phase].seconds)
        if theirs >= min_seconds:
            out[phase] = statistics.median(row["seconds"]["samples"]) / theirs
    return out


def peer_factors(ratios: dict[str, float]) -> dict[str, float]:
    """Per phase, the median of the other phases' ratios (1.0 with fewer than two others)."""
    return {
        phase: statistics.median(others) if len(others := [r for p, r in ratios.items() if p != phase]) >= 2 else 1.0
        for phase in ratios
    }


def scaled_report(report: dict, factors: dict[str, float]) -> dict:
    """The report with each phase's rounds divided by its peer factor."""
    out = copy.deepcopy(report)
    for phase, factor in factors.items():
        seconds = out["phases"][phase]["seconds"]
        seconds["samples"] = [t / factor for t in seconds["samples"]]
    return out


def session_outcome(report: dict, base: RunRecord, tolerance: float, min_seconds: float) -> tuple[str, list[str]]:
    """(outcome, lines): failed when a phase's time fails both plainly and against its peers."""
    factors = peer_factors(plain_ratios(report, base, min_seconds))
    plain = compare(record_of_report(report), base, tolerance).comparisons
    peer = {c.metric: c for c in compare(record_of_report(scaled_report(report, factors)), base, tolerance).comparisons}
    outcome, lines = "passed", []
    for c in plain:
        if c.verdict != "fail":
            if c.verdict == "inconclusive" and outcome == "passed":
                outcome = "inconclusive"
            continue
        other = peer.get(c.metric)
        against_peers = other is not None and other.verdict == "fail"
        if c.metric.startswith(f"{TIMING}/") and c.phase in factors and not against_peers:
            outcome = "inconclusive" if outcome == "passed" else outcome
            lines.append(f"inconclusive {c.phase}: ratio {c.ratio:.2f}, peers {factors[c.phase]:.2f}")
            continue
        outcome = "failed"
        lines.append(f"failed {c.metric}: ratio {c.ratio:.2f}, peers {factors.get(c.phase or '', 1.0):.2f}")
    return outcome, lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", type=Path, help="a gate_error_rates.py work directory")
    parser.add_argument("--tolerance", type=float, default=0.20)
    parser.add_argument("--min-seconds", type=float, default=0.05)
    args = parser.parse_args(argv)
    base = load_record(args.work / "base.json")
    counts: dict[str, dict[str, int]] = {}
    for path in sorted(args.work.glob("*-*.report.json"), key=lambda p: (p.name.rsplit("-", 1)[0], len(p.name), p.name)):
        scenario = path.name.split(".")[0].rsplit("-", 1)[0]
        outcome, lines = session_outcome(json.loads(path.read_text()), base, args.tolerance, args.min_seconds)
        counts.setdefault(scenario, {"passed": 0, "failed": 0, "inconclusive": 0})[outcome] += 1
        print(f"{path.name}: {outcome}" + "".join(f"\n    {line}" for line in lines))
    for scenario, c in counts.items():
        print(f"{scenario}: {sum(c.values())} runs, {c['passed']} passed, {c['failed']} failed, "
              f"{c['inconclusive']} inconclusive")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
