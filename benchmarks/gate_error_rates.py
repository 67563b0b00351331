"""How often the performance gate is wrong, measured on this machine (issue 12, item 2).

1. Saves a baseline of ``pytest suites/`` (the embedded default unless ``--pytest-arg`` says more).
2. Reruns the suites ``--runs`` times (default 20) on unchanged code against it: each run should pass.
3. Reruns them ``--runs`` times under 2x CPU contention: one busy-loop process per core, started
   before and stopped (by PID) after each run; each run should fail.
4. Reruns them ``--runs`` times with one phase made ``--slowdown`` (default 25%) slower by the
   test-only plugin ``benchmarks/gate_slow_phase.py`` (loaded with ``-p gate_slow_phase``; it sleeps
   that fraction of each call's own duration after the phase method ``--slow-method``); each run
   should fail.

A run counts as "failed" when any figure failed the gate, else "inconclusive" when any was
inconclusive, else "passed"; a session that ended otherwise (a crash, ``--timeout``) is an "error".
The table (scenario, runs, passed, failed, inconclusive, errors) is printed, and written with every
run's verdict lines (the failed and inconclusive figures' messages) as JSON to ``--out``:

    python benchmarks/gate_error_rates.py --runs 20 --out gate_error_rates.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = Path(__file__).resolve().parent
SCENARIOS = ("unchanged", "contention", "slowdown")
BUSY_LOOP = "while True:\n    pass\n"


@dataclass
class RunResult:
    index: int
    outcome: str  # "passed", "failed", "inconclusive" or "error"
    exit_status: int | None
    seconds: float
    verdicts: list[str] = field(default_factory=list)  # "verdict: message" of each figure not passed


@dataclass
class ScenarioResult:
    scenario: str
    runs: list[RunResult] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        return sum(r.outcome == outcome for r in self.runs)


def pytest_command(extra: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", str(ROOT / "suites"), "-q", "-p", "no:cacheprovider", *extra]


def outcome_of(report: dict, baseline_name: str) -> tuple[str, list[str]]:
    """The run's outcome against the saved baseline and the verdict lines of the figures not passed."""
    rows = [c for c in report.get("comparisons", []) if c["source"] == baseline_name and c["mode"] == "gate"]
    lines = [f"{c['verdict']}: {c['message']}" for c in rows if c["verdict"] in ("fail", "inconclusive")]
    verdicts = {c["verdict"] for c in rows}
    outcome = "failed" if "fail" in verdicts else "inconclusive" if "inconclusive" in verdicts else "passed"
    return outcome, lines


def run_once(index: int, command: list[str], report: Path, env: dict[str, str], timeout: float) -> RunResult:
    start = time.monotonic()
    try:
        done = subprocess.run(command + [f"--rl-report={report}"], cwd=ROOT, env=env, timeout=timeout,
                              capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return RunResult(index, "error", None, time.monotonic() - start, [f"timed out after {timeout:g} s"])
    seconds = time.monotonic() - start
    if done.returncode not in (0, 1) or not report.exists():
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        return RunResult(index, "error", done.returncode, seconds, [f"exit status {done.returncode}", *tail])
    outcome, lines = outcome_of(json.loads(report.read_text()), "base")
    if done.returncode == 1 and outcome == "passed":  # a test failed for another reason than the gate
        outcome, lines = "error", ["exit status 1 with no failed figure", *done.stdout.strip().splitlines()[-5:]]
    report.unlink()
    return RunResult(index, outcome, done.returncode, seconds, lines)


@contextmanager
def cpu_contention(processes: int) -> Iterator[list[int]]:
    """``processes`` busy loops for the duration of the block, stopped by their PIDs afterwards."""
    loops = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(processes)]
    try:
        yield [p.pid for p in loops]
    finally:
        for p in loops:
            p.terminate()
        for p in loops:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def scenario_env(scenario: str, slow_method: str, slowdown: float) -> tuple[dict[str, str], list[str]]:
    env = dict(os.environ)
    if scenario != "slowdown":
        return env, []
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCHMARKS), env.get("PYTHONPATH", "")) if p)
    env["GATE_SLOW_METHOD"], env["GATE_SLOWDOWN"] = slow_method, str(slowdown)
    return env, ["-p", "gate_slow_phase"]


def run_scenario(scenario: str, args: argparse.Namespace, baseline: Path, work: Path) -> ScenarioResult:
    env, plugin = scenario_env(scenario, args.slow_method, args.slowdown)
    command = pytest_command([*args.pytest_arg, *plugin, f"--rl-baseline={baseline}"])
    result = ScenarioResult(scenario)
    for i in range(1, args.runs + 1):
        report = work / f"{scenario}-{i}.json"
        if scenario == "contention":
            with cpu_contention(os.cpu_count() or 1):
                run = run_once(i, command, report, env, args.timeout)
        else:
            run = run_once(i, command, report, env, args.timeout)
        result.runs.append(run)
        print(f"{scenario} run {i}/{args.runs}: {run.outcome} ({run.seconds:.0f} s)", flush=True)
        for line in run.verdicts:
            print(f"    {line}", flush=True)
    return result


def table(results: Sequence[ScenarioResult]) -> list[str]:
    rows = [("scenario", "runs", "passed", "failed", "inconclusive", "errors")]
    rows += [
        (r.scenario, str(len(r.runs)), *(str(r.count(o)) for o in ("passed", "failed", "inconclusive", "error")))
        for r in results
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="reruns per scenario (default 20)")
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--slow-method", default="compute_old_log_prob", help="the GRPOTrainer method slowed")
    parser.add_argument("--slowdown", type=float, default=0.25, help="fraction of the phase's time added")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds one pytest session may take")
    parser.add_argument("--pytest-arg", action="append", default=[], help="passed to every pytest session")
    parser.add_argument("--out", type=Path, default=Path("gate_error_rates.json"), help="the JSON table")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gate-error-rates-"))
    baseline = work / "base.json"
    print(f"saving the baseline to {baseline}", flush=True)
    saved = subprocess.run(pytest_command([*args.pytest_arg, f"--rl-save-baseline={baseline}"]), cwd=ROOT,
                           timeout=args.timeout, capture_output=True, text=True)
    if saved.returncode != 0 or not baseline.exists():
        print((saved.stdout + saved.stderr)[-3000:], file=sys.stderr)
        print(f"the baseline session failed (exit status {saved.returncode})", file=sys.stderr)
        return 2
    results = [run_scenario(s, args, baseline, work) for s in args.scenarios]
    lines = table(results)
    print("\n".join(lines))
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    out = {"settings": settings, "cpus": os.cpu_count(), "table": lines, "scenarios": [asdict(r) for r in results]}
    args.out.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
