"""How often the GPU gate is wrong, judged from sessions' JSON reports (issue 29, item 5).

The sessions come from ``benchmarks/gpu_suites.sh OUT gate16x8`` (RL_GATE_PLAN names each: ``same`` for
unchanged code, ``METHOD_FRACTION`` for a GRPOTrainer method made FRACTION slower by real GPU work,
``benchmarks/gate_slow_phase.py``), one directory per machine. Every unchanged session serves as a
baseline for every other session, the way a CI pool of runners would gate: each ordered pair
(run, baseline) is judged by the plugin's own ``compare`` at the tolerances and floors it would apply
(``--tolerance`` overrides them all), and counted:

- unchanged run against an unchanged baseline: should pass (same machine and across machines apart);
- slowed run against an unchanged baseline: should fail on the slowed phase.

    python benchmarks/gate_gpu_rates.py H100-A=docs/.../x1a H100-B=docs/.../x1b [--tolerance 0.05] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gate_error_rates import record_of_report  # noqa: E402

from pytest_rlbench.records.record import RunRecord  # noqa: E402
from pytest_rlbench.verdict.compare import compare  # noqa: E402
from pytest_rlbench.verdict.noise import default_tolerance  # noqa: E402

# The phase a slowed method's time lands in (gen = reshard + generate_sequences).
SLOWED_PHASES = {"update_actor": ("update_actor",), "generate_sequences": ("generate_sequences", "gen"),
                 "compute_old_log_prob": ("old_log_prob",)}


@dataclass(frozen=True)
class Session:
    machine: str
    name: str  # "same" or "<method>_<fraction>"
    record: RunRecord

    @property
    def slowed(self) -> str | None:
        return None if self.name == "same" else self.name.rsplit("_", 1)[0]


def sessions(spec: Sequence[str]) -> list[Session]:
    """Every gate16x8 report in each MACHINE=DIRECTORY."""
    out = []
    for item in spec:
        machine, _, directory = item.partition("=")
        for path in sorted(Path(directory).glob("*16x8-*.json")):  # noise16x8-N: unchanged code too
            name = path.stem.split("-", 2)[2] if path.stem.startswith("gate16x8-") else "same"
            out.append(Session(machine, name, record_of_report(json.loads(path.read_text()))))
    return out


def judged(run: Session, base: Session, tolerance: float | None) -> tuple[str, list[str]]:
    """("failed" | "inconclusive" | "passed", the failing/inconclusive rows' messages)."""
    tol = default_tolerance(gpu=True) if tolerance is None else tolerance
    rows = [c for c in compare(run.record, base.record, tol).comparisons if c.verdict in ("fail", "inconclusive")]
    verdicts = {c.verdict for c in rows}
    outcome = "failed" if "fail" in verdicts else "inconclusive" if verdicts else "passed"
    return outcome, [f"{c.verdict}: {c.message}" for c in rows]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("machines", nargs="+", help="MACHINE=DIRECTORY of gate16x8 reports")
    parser.add_argument("--tolerance", type=float, default=None, help="one tolerance for every phase")
    parser.add_argument("--json", type=Path, default=None, help="write every pair's outcome here")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each wrong pair's rows")
    args = parser.parse_args(argv)
    all_sessions = sessions(args.machines)
    bases = [s for s in all_sessions if s.slowed is None]
    counts: dict[str, Counter[str]] = {}
    pairs = []
    for run in all_sessions:
        for base in bases:
            if run is base:
                continue
            outcome, rows = judged(run, base, args.tolerance)
            if run.slowed is None:
                scenario = "unchanged, same machine" if run.machine == base.machine else "unchanged, across machines"
                wrong = outcome != "passed"
            else:
                scenario = f"{run.name} slower"
                phases = SLOWED_PHASES.get(run.slowed, (run.slowed,))
                caught = any(r.startswith("fail:") and any(f"{p} seconds" in r for p in phases) for r in rows)
                outcome = "caught" if caught else f"missed ({outcome})"
                wrong = not caught
            counts.setdefault(scenario, Counter())[outcome] += 1
            pairs.append({"run": f"{run.machine}/{run.name}", "baseline": f"{base.machine}/{base.name}",
                          "scenario": scenario, "outcome": outcome, "rows": rows})
            if wrong and args.verbose:
                print(f"{scenario}: {run.machine}/{run.name} vs {base.machine}/{base.name}: {outcome}")
                for r in rows:
                    print(f"    {r[:300]}")
    for scenario, counter in counts.items():
        print(f"{scenario:32s} pairs {sum(counter.values()):3d}  " + ", ".join(f"{k} {v}" for k, v in sorted(counter.items())))
    if args.json is not None:
        args.json.write_text(json.dumps({"tolerance": args.tolerance, "counts": counts, "pairs": pairs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
