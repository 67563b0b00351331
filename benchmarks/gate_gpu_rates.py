"""How often the GPU gate is wrong, judged from sessions' JSON reports (issue 29, item 5).

The sessions come from ``benchmarks/gpu_suites.sh OUT gate16x8`` (or ``gate-default``, the embedded
default's tiny model on the GPU; RL_GATE_PLAN names each: ``same`` for
unchanged code, ``METHODS:FRACTION`` for GRPOTrainer methods, comma-separated, made FRACTION slower by
real GPU work, ``benchmarks/gate_slow_phase.py``; the report is named ``gate16x8-NN-<entry with ':' and
',' as '_'>.json``), one directory per machine. A session whose reports name the machine they ran on
(``run.hardware.machine``: a hash of the GPU UUIDs and the driver) is grouped by that, under the first
directory's label seen for it: two calls that landed on the same machine are one machine. Every
unchanged session serves as a baseline for every other session, the way a CI pool of runners would
gate: each ordered pair (run, baseline) is judged by the plugin's own ``compare`` at the tolerances and
floors it would apply (``--tolerance`` overrides them all, ``--tolerance-for PHASE=VALUE`` one phase's,
through the baseline's own per-metric tolerances), and counted:

- unchanged run against an unchanged baseline: should pass (same machine and across machines apart),
  and which phases failed when it did not;
- slowed run against an unchanged baseline, once for each slowed method and per fraction: caught when
  the phase that method's time lands in fails, "caught in step" when only a phase that holds it fails
  (the step holds the update); per session, against how many baselines it was caught on its own phase;
  the pairs whose baseline ran on the run's own machine are counted apart ("..., same machine").

    python benchmarks/gate_gpu_rates.py H100-A=docs/.../x1a H100-B=docs/.../x1b \
        [--tolerance 0.05] [--tolerance-for update_actor=0.06] [--no-counts] [--json out.json] [-v]

A session that saved itself as a baseline (``NAME.baseline.json`` beside its report, as gate16x8 runs
them) counted each phase's work; its report carries the counts and the verdicts read them
(``--no-counts``: the time alone).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gate_error_rates import record_of_report  # noqa: E402

from pytest_rlbench.records.metrics import METRIC_FAMILIES, family_of  # noqa: E402
from pytest_rlbench.records.record import RunRecord  # noqa: E402
from pytest_rlbench.verdict.compare import compare  # noqa: E402
from pytest_rlbench.verdict.judge import WORK  # noqa: E402
from pytest_rlbench.verdict.noise import default_tolerance  # noqa: E402
from trainer.phases import PHASE_KEYS, phases_within  # noqa: E402

# The phases a slowed method's time lands in (gen = reshard + generate_sequences).
SLOWED_PHASES = {
    "update_actor": ("update_actor",),
    "generate_sequences": ("generate_sequences", "gen"),
    "compute_old_log_prob": ("old_log_prob",),
}


def catch_of(failed_phases: Sequence[str], slowed: Sequence[str], outcome: str) -> str:
    """How a slowed session's pair came out: "caught" where a phase the slowed method's time lands in
    failed; "caught in step" (say) where only a phase that holds one of them did (the step holds the
    update: its time and counts carry the regression too); else "missed (<the pair's outcome>)"."""
    if any(p in failed_phases for p in slowed):
        return "caught"
    holders = sorted(p for p in failed_phases if p in PHASE_KEYS and any(s in phases_within(p) for s in slowed))
    return f"caught in {', '.join(holders)}" if holders else f"missed ({outcome})"


def parse_name(name: str) -> tuple[tuple[str, ...], str | None]:
    """A session's plan entry from its report's name: ((), None) for "same", else (the slowed methods,
    the fraction as written). Method names hold '_' as the separator does: the known ones are matched
    first, longest first; an unknown remainder is one method (the single-method names of old)."""
    if name == "same":
        return (), None
    rest, _, fraction = name.rpartition("_")
    methods: list[str] = []
    while rest:
        known = next(
            (
                m
                for m in sorted(SLOWED_PHASES, key=len, reverse=True)
                if rest == m or rest.startswith(m + "_")
            ),
            None,
        )
        methods.append(known or rest)
        rest = rest[len(known) + 1 :] if known else ""
    return tuple(methods), fraction


@dataclass(frozen=True)
class Session:
    machine: str
    name: str  # "same" or "<method>[_<method>...]_<fraction>"
    record: RunRecord
    path: str = ""

    @property
    def methods(self) -> tuple[str, ...]:
        return parse_name(self.name)[0]

    @property
    def fraction(self) -> str | None:
        return parse_name(self.name)[1]

    @property
    def label(self) -> str:
        return f"{self.machine}/{self.path or self.name}"


def without_counts(record: RunRecord) -> RunRecord:
    """The record without its counted work (``work/*``): what the time alone decides."""
    return replace(record, metrics={m: v for m, v in record.metrics.items() if family_of(m) != WORK})


def sessions(spec: Sequence[str], counts: bool = True) -> list[Session]:
    """Every gate16x8 (or gate-default) report in each MACHINE=DIRECTORY, grouped by the machine the report names
    (``counts`` False: each read without its counted work)."""
    out, labels = [], {}
    for item in spec:
        machine, _, directory = item.partition("=")
        # gate16x8-NN-ENTRY and gatedefault-NN-ENTRY sessions; noise16x8-N: unchanged code too
        paths = [*Path(directory).glob("*16x8-*.json"), *Path(directory).glob("gatedefault-*.json")]
        for path in sorted(paths):
            if path.name.endswith(".baseline.json"):  # the session saved as a baseline: its report is beside it
                continue
            name = path.stem.split("-", 2)[2] if path.stem.startswith(("gate16x8-", "gatedefault-")) else "same"
            record = record_of_report(json.loads(path.read_text()))
            record = record if counts else without_counts(record)
            where = (
                labels.setdefault(record.hardware.machine, machine) if record.hardware.machine else machine
            )
            out.append(Session(where, name, record, f"{Path(directory).name}/{path.stem}"))
    return out


def with_tolerances(base: RunRecord, per_phase: dict[str, float]) -> RunRecord:
    """The baseline with its own tolerance for every figure of each named phase, as a baseline file
    that sets ``tolerances`` would carry (the gate then applies it in place of the measured default)."""
    if not per_phase:
        return base
    chosen = {f"{family}/{phase}": value for phase, value in per_phase.items() for family in METRIC_FAMILIES}
    return replace(base, tolerances={**base.tolerances, **chosen})


def judged(run: Session, base: Session, tolerance: float | None, per_phase: dict[str, float]):
    """("failed" | "inconclusive" | "passed", the failing/inconclusive comparisons)."""
    # the default of the sessions' device: the script also recounts CPU sessions' reports
    tol = default_tolerance(gpu=base.record.hardware.device == "gpu") if tolerance is None else tolerance
    result = compare(run.record, with_tolerances(base.record, per_phase), tol)
    rows = [c for c in result.comparisons if c.verdict in ("fail", "inconclusive")]
    verdicts = {c.verdict for c in rows}
    return ("failed" if "fail" in verdicts else "inconclusive" if verdicts else "passed"), rows


def phase_of(metric: str) -> str:
    return metric.partition("/")[2] or metric


def parse_phase_tolerance(text: str) -> tuple[str, float]:
    phase, sep, value = text.partition("=")
    try:
        if not sep or not phase:
            raise ValueError
        return phase, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected PHASE=VALUE, e.g. update_actor=0.06") from None


def rates(all_sessions: list[Session], tolerance: float | None, per_phase: dict[str, float]) -> dict:
    """Every ordered pair judged: the counts per scenario, the phases unchanged pairs failed on, and
    per slowed (method, fraction) the pairs and the sessions caught."""
    bases = [s for s in all_sessions if not s.methods]
    counts: dict[str, Counter[str]] = {}
    unchanged_phases: dict[str, Counter[str]] = {}
    caught_by_session: dict[str, dict[str, list[int]]] = {}  # scenario -> session -> [caught, baselines]
    pairs = []
    for run in all_sessions:
        for base in bases:
            if run is base:
                continue
            outcome, rows = judged(run, base, tolerance, per_phase)
            messages = [f"{c.verdict}: {c.message}" for c in rows]
            failed_phases = sorted({phase_of(c.metric) for c in rows if c.verdict == "fail"})
            entry = {
                "run": run.label,
                "baseline": base.label,
                "outcome": outcome,
                "failed_phases": failed_phases,
                "rows": messages,
            }
            if not run.methods:
                scenario = (
                    "unchanged, same machine" if run.machine == base.machine else "unchanged, across machines"
                )
                counts.setdefault(scenario, Counter())[outcome] += 1
                unchanged_phases.setdefault(scenario, Counter()).update(failed_phases)
                pairs.append({**entry, "scenario": scenario})
                continue
            for method in run.methods:  # a session slowed in several methods counts once for each
                scenario = f"{method} +{float(run.fraction) * 100:g}%"
                if run.machine == base.machine:  # a baseline from the machine itself: the one-machine tolerances
                    scenario += ", same machine"
                phases = SLOWED_PHASES.get(method, (method,))
                verdict = catch_of(failed_phases, phases, outcome)
                counts.setdefault(scenario, Counter())[verdict] += 1
                tally = caught_by_session.setdefault(scenario, {}).setdefault(run.label, [0, 0])
                tally[0] += verdict == "caught"
                tally[1] += 1
                pairs.append({**entry, "scenario": scenario, "outcome": verdict})
    return {
        "tolerance": tolerance,
        "tolerance_for": per_phase,
        "counts": counts,
        "unchanged_failed_phases": unchanged_phases,
        "caught_by_session": caught_by_session,
        "pairs": pairs,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("machines", nargs="+", help="MACHINE=DIRECTORY of gate16x8 reports")
    parser.add_argument("--tolerance", type=float, default=None, help="one tolerance for every phase")
    parser.add_argument(
        "--tolerance-for",
        type=parse_phase_tolerance,
        action="append",
        default=[],
        metavar="PHASE=VALUE",
        help="this phase's tolerance instead (repeatable)",
    )
    parser.add_argument(
        "--no-counts", action="store_true", help="judge the time alone: every report read without its counted work"
    )
    parser.add_argument("--json", type=Path, default=None, help="write every pair's outcome here")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each wrong pair's rows")
    args = parser.parse_args(argv)
    all_sessions = sessions(args.machines, counts=not args.no_counts)
    result = rates(all_sessions, args.tolerance, dict(args.tolerance_for))
    machines = Counter(s.machine for s in all_sessions)
    print("sessions per machine: " + ", ".join(f"{m} {n}" for m, n in machines.items()))
    if args.verbose:
        for pair in result["pairs"]:
            if pair["outcome"] != "passed" and not pair["outcome"].startswith("caught"):
                print(f"{pair['scenario']}: {pair['run']} vs {pair['baseline']}: {pair['outcome']}")
                for r in pair["rows"]:
                    print(f"    {r[:300]}")
    for scenario, counter in result["counts"].items():
        line = f"{scenario:30s} pairs {sum(counter.values()):3d}  " + ", ".join(
            f"{k} {v}" for k, v in sorted(counter.items())
        )
        if scenario in result["unchanged_failed_phases"] and result["unchanged_failed_phases"][scenario]:
            line += (
                "  (failed on "
                + ", ".join(
                    f"{p} {n}" for p, n in sorted(result["unchanged_failed_phases"][scenario].items())
                )
                + ")"
            )
        if scenario in result["caught_by_session"]:
            tallies = result["caught_by_session"][scenario].values()
            every = sum(c == n for c, n in tallies)
            most = sum(2 * c > n for c, n in tallies)
            line += f"  sessions {len(tallies)}: caught by every baseline {every}, by most {most}"
        print(line)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
