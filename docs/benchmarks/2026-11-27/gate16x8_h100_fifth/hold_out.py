"""The GPU tolerances tested on machines they were not set on: for each H100 machine, the tolerances
are set by noise.py's rule (largest spread of each phase's median between unchanged sessions, rounded
up to a whole percent, plus one point, at least 3%) from the unchanged sessions of every *other*
machine, and every pair of unchanged sessions with one side on the held-out machine is judged at them.

    PYTHONPATH=. python docs/benchmarks/2026-11-27/gate16x8_h100_fifth/hold_out.py SPEC...

SPEC: the MACHINE=DIRECTORY arguments of benchmarks/gate_gpu_rates.py (both days' sessions)."""

import math
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "benchmarks"))
from gate_gpu_rates import judged, phase_of, sessions  # noqa: E402

PHASES = ("gen", "generate_sequences", "old_log_prob", "ref", "update_actor", "step")


def rule(spread: float) -> float:
    return max(0.03, (math.ceil(round(spread * 100, 6)) + 1) / 100)


def tolerances(unchanged) -> dict[str, float]:
    out = {}
    for phase in PHASES:
        medians = [statistics.median(s.record.phases[phase].seconds) for s in unchanged]
        out[phase] = rule(max(medians) / min(medians) - 1)
    return out


def main(spec: list[str]) -> None:
    unchanged = [s for s in sessions(spec, counts=False) if not s.methods]
    machines = sorted({s.machine for s in unchanged})
    print(f"{len(unchanged)} unchanged sessions on {len(machines)} machines; all: {tolerances(unchanged)}")
    total, failed_phases = Counter(), Counter()
    for held in machines:
        rest = [s for s in unchanged if s.machine != held]
        if len({s.machine for s in rest}) < 2:
            continue
        tol = tolerances(rest)
        pairs = Counter()
        for run in unchanged:
            for base in unchanged:
                if run is base or (run.machine == held) == (base.machine == held):
                    continue  # one side held out, the other not
                outcome, rows = judged(run, base, None, tol)
                pairs[outcome] += 1
                failed_phases.update({phase_of(c.metric) for c in rows if c.verdict == "fail"})
        total.update(pairs)
        print(f"held out {held:10s} ({sum(s.machine == held for s in unchanged)} sessions): "
              f"tolerances {tol}: pairs {dict(pairs)}")
    print(f"all held-out pairs: {dict(total)}; failed on {dict(failed_phases)}")


if __name__ == "__main__":
    main(sys.argv[1:])
