"""How far gate-default sessions' phases lie apart side by side, and how every pair was judged.

Run from the repository root:

    python3 THIS H200-m3=DIR H200-m4=DIR ...               # spreads per phase, all passes
    python3 THIS --passes 12 H200-m4=DIR                    # the same over each session's first 12 passes
    python3 THIS --verdicts H200-m3=DIR ...                 # each phase's verdicts and ratios over all pairs

A spread is the largest ratio, less 1, of a phase's level side by side between two unchanged sessions
(``session_pace.side_by_side`` of one against the other), on one machine and across machines; the GPU
side-by-side tolerances are these plus one point.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT)]

from gate_gpu_rates import Session, sessions  # noqa: E402

from pytest_rlbench.records.metrics import SIDE_BY_SIDE, TIMING, family_of  # noqa: E402
from pytest_rlbench.verdict.compare import compare  # noqa: E402
from pytest_rlbench.verdict.noise import default_tolerance  # noqa: E402
from pytest_rlbench.verdict.session_pace import side_by_side  # noqa: E402

PHASES = ("gen", "generate_sequences", "old_log_prob", "ref", "update_actor", "step", "save_checkpoint",
          "reshard", "reward", "adv")


def first_passes(session: Session, n: int) -> Session:
    """``session`` with only its first ``n`` side-by-side passes."""
    metrics = {
        name: dataclasses.replace(m, value=list(m.value)[:n]) if name.startswith(f"{SIDE_BY_SIDE}/") else m
        for name, m in session.record.metrics.items()
    }
    return dataclasses.replace(session, record=dataclasses.replace(session.record, metrics=metrics))


def spreads(unchanged: list[Session]) -> None:
    for phase in PHASES:
        same: list[float] = []
        across: list[float] = []
        for a, b in itertools.permutations(unchanged, 2):
            evidence = side_by_side(a.record, b.record, phase)
            if evidence is not None:
                (same if a.machine == b.machine else across).append(evidence.ratio)
        print(f"{phase:20s} same machine max {spread_text(same)}   across {spread_text(across)}")


def spread_text(ratios: list[float]) -> str:
    return f"{max(ratios) - 1:+.0%} (n={len(ratios)})" if ratios else "-"


def verdicts(every: list[Session]) -> None:
    tally: Counter[tuple[str, str, str, str]] = Counter()
    ratios: dict[tuple[str, str], list[tuple[float, float | None]]] = defaultdict(list)
    for run, base in itertools.permutations(every, 2):
        if base.name != "same":
            continue
        for c in compare(run.record, base.record, default_tolerance(True)).comparisons:
            if family_of(c.metric) != TIMING or c.verdict not in ("pass", "fail", "inconclusive"):
                continue
            tally[(run.name, c.phase, c.verdict, c.reason)] += 1
            evidence = side_by_side(run.record, base.record, c.phase)
            ratios[(run.name, c.phase)].append((c.ratio, evidence.ratio if evidence else None))
    for key, count in sorted(tally.items()):
        print(*key, count)
    for (name, phase), pairs in sorted(ratios.items()):
        plain = [r for r, _ in pairs if r]
        beside = [s for _, s in pairs if s]
        side = f"{min(beside):.2f}-{max(beside):.2f}" if beside else "none"
        print(f"{name:22s} {phase:20s} in seconds {min(plain):.2f}-{max(plain):.2f}  side by side {side}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("machines", nargs="+", help="MACHINE=DIRECTORY of gatedefault-*.json reports")
    parser.add_argument("--passes", type=int, help="read only each session's first PASSES passes")
    parser.add_argument("--verdicts", action="store_true", help="each phase's verdicts over every pair")
    args = parser.parse_args()
    every = sessions(args.machines)
    if args.passes:
        every = [first_passes(s, args.passes) for s in every]
    if args.verdicts:
        verdicts(every)
    else:
        spreads([s for s in every if s.name == "same"])


if __name__ == "__main__":
    main()
