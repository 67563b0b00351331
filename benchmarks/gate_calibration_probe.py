"""Does the machine's calibration track the phases' speed from session to session? (issue 12)

Runs ``--sessions`` pytest sessions of the embedded default one after another (this file is their
test module). Each session builds the trainer, runs the warm-up step, then ``--rounds`` times, for
each of old_log_prob, update_actor and gen: the calibration in the driver (``calibration_round``),
the calibration inside the Ray workers (``workers_calibration``, what the gate records), then the
phase itself, timed, with the CPU time it took in the busiest worker (getrusage) and the CPU used
beside it by processes outside the session (/proc).

Printed per phase: each session's median phase time and calibrations as ratios to the first
session's, and the spread (largest / smallest) across sessions of the plain medians and of the
medians divided by each calibration. A calibration that tracks the machine makes the divided spread
smaller than the plain one; one that does not makes it larger. Raw rounds go to ``--out``.

    python benchmarks/gate_calibration_probe.py --sessions 6 --rounds 8 --out calibration_probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_ENV, ROUNDS_ENV = "GATE_PROBE_OUT", "GATE_PROBE_ROUNDS"
# The two calibrations compared, and the phase's own CPU time in the busiest worker: not a calibration
# (a change that adds work adds to it) but it shows whether the drift is the same work costing more
# CPU time, or waiting.
FIGURES = ("driver", "workers", "phase_cpu")


def worker_cpu_s(worker: object) -> float:
    """This Ray worker process's user + system CPU seconds so far (``actor.__ray_call__``)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def test_probe(rl_trainer, rl_batch) -> None:  # noqa: ANN001  (run by pytest, from main below)
    """One session's rounds (see the module docstring), written to $GATE_PROBE_OUT."""
    from ray import cloudpickle

    from pytest_rlbench.machine_load import calibration_round, cores_used, cpu_snapshot, workers_calibration

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this file
    group = rl_trainer.workers
    in_workers = workers_calibration(group)

    def cpu_s() -> list[float]:
        return group.wait([w.__ray_call__.remote(worker_cpu_s) for w in group.workers], "probe")
    phases = {
        "old_log_prob": lambda: rl_trainer.compute_old_log_prob(rl_batch.batch),
        "update_actor": lambda: rl_trainer.update_actor(rl_batch.batch),
        "gen": lambda: (rl_trainer.reshard(), rl_trainer.generate_sequences(rl_batch.prompts)),
    }
    rows = []
    for index in range(int(os.environ[ROUNDS_ENV])):
        for phase, run in phases.items():
            driver, (workers, _) = calibration_round(), in_workers()
            cpu_before, before, start = cpu_s(), cpu_snapshot(), time.perf_counter()
            run()
            seconds, after = time.perf_counter() - start, cpu_snapshot()
            phase_cpu = max(b - a for a, b in zip(cpu_before, cpu_s(), strict=True))
            other = cores_used(before, after, float(os.sysconf("SC_CLK_TCK")))[0] if before and after else None
            rows.append({"round": index, "phase": phase, "seconds": seconds, "driver": driver, "workers": workers,
                         "phase_cpu": phase_cpu, "other_cores": other})
    Path(os.environ[OUT_ENV]).write_text(json.dumps(rows))


def spread(values: list[float]) -> float:
    """Largest over smallest."""
    return max(values) / min(values)


def summary(sessions: list[list[dict]]) -> list[str]:
    """Per phase: each session's ratios to the first, and the spreads across sessions (docstring)."""
    lines = []
    for phase in dict.fromkeys(row["phase"] for row in sessions[0]):
        medians = [
            {key: statistics.median(r[key] for r in rows if r["phase"] == phase) for key in ("seconds", *FIGURES)}
            for rows in sessions
        ]
        others = [statistics.mean(r["other_cores"] or 0.0 for r in rows if r["phase"] == phase) for rows in sessions]
        first = medians[0]
        lines.append(f"{phase}: session, phase, driver calibration, workers' calibration, the phase's CPU time "
                     "(ratios to session 1), other cores")
        for i, (m, other) in enumerate(zip(medians, others, strict=True), start=1):
            ratios = "  ".join(f"{m[key] / first[key]:.2f}" for key in ("seconds", *FIGURES))
            lines.append(f"  {i:3d}  {ratios}  {other:.2f}")
        plain = spread([m["seconds"] for m in medians])
        divided = ", ".join(f"/ {key} {spread([m['seconds'] / m[key] for m in medians]):.2f}" for key in FIGURES)
        lines.append(f"  spread: plain {plain:.2f}, {divided}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("calibration_probe.json"))
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gate-calibration-probe-"))
    sessions = []
    for i in range(1, args.sessions + 1):
        out = work / f"session-{i}.json"
        env = {**os.environ, OUT_ENV: str(out), ROUNDS_ENV: str(args.rounds)}
        done = subprocess.run([sys.executable, "-m", "pytest", f"{Path(__file__).resolve()}::test_probe", "-q",
                               "-p", "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode != 0 or not out.exists():
            print((done.stdout + done.stderr)[-3000:], file=sys.stderr)
            return 2
        sessions.append(json.loads(out.read_text()))
        print(f"session {i}/{args.sessions} done", flush=True)
    lines = summary(sessions)
    print("\n".join(lines))
    args.out.write_text(json.dumps({"rounds": args.rounds, "summary": lines, "sessions": sessions}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
