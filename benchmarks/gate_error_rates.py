"""How often the performance gate is wrong, measured on this machine (issue 12, item 2).

1. Saves a baseline of ``pytest suites/`` (the embedded default unless ``--pytest-arg`` says more),
   ``--baseline-sessions`` times over the same file (default 1), which then keeps each session's
   blocks of rounds (``pytest_rlbench.verdict.retiming.with_earlier_sessions``).
2. Reruns the suites ``--runs`` times (default 20) on unchanged code against it: each run should pass.
3. Reruns them ``--runs`` times under 2x CPU contention: one busy-loop process per core, started
   before and stopped (by PID) after each run; each run should fail.
4. Reruns them ``--runs`` times with one phase made ``--slowdown`` (default 25%) slower by the
   test-only plugin ``benchmarks/gate_slow_phase.py`` (loaded with ``-p gate_slow_phase``; it sleeps
   that fraction of each call's own duration after the phase method ``--slow-method``); each run
   should fail.
5. Scenario ``slowwork``: the same, ``--slow-work`` (default 10%) slower by real CPU work instead of
   a sleep (fp32 matmuls on every worker, ``GATE_SLOW_CPU_WORK=1``), which the phase's counted work
   sees; each run should fail.

A run counts as "failed" when any figure failed the gate, else "inconclusive" when any was
inconclusive, else "passed"; a session that ended otherwise (a crash, ``--timeout``) is an "error".
An inconclusive run does not fail its session (pytest exits 0): for the same-code goal it counts as
not failed, for the slowdown and contention goals as not caught; the table lists it apart.

Between sessions the harness waits for quiescence (``settle``): until no process of an earlier
session is left (each session's processes carry ``RUN_MARK`` in their environment, which Ray's
processes inherit) and the machine's CPU use stays below ``--quiet-cores`` for 2 s, up to
``--settle-timeout``, after ``--cool-down`` seconds of idling (default 0: sessions back to back; a CI
job starts on a machine that was idle); what it found (leftover processes, seconds waited) is kept with each run, with
the CPU the session's machine spent busy and stolen by the hypervisor (/proc/stat), and each gated
phase's plain ratio, the session's pace around it (the factor the gate divides by,
``pytest_rlbench.verdict.session_pace``) and the cores used beside its rounds by other processes and stolen.

The table (scenario, runs, passed, failed, inconclusive, errors) is printed, and written with all of
that as JSON to ``--out``; every session's JSON report (which holds its run record) is kept in the
work directory, so ``--rejudge WORKDIR --tolerance T`` recounts the outcomes at another tolerance
without rerunning:

    python benchmarks/gate_error_rates.py --runs 20 --out gate_error_rates.json
    python benchmarks/gate_error_rates.py --rejudge /tmp/gate-error-rates-XXXX --tolerance 0.20
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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from pytest_rlbench.records.metrics import PANEL_FIGURES  # noqa: E402
from pytest_rlbench.records.record import FORMAT_VERSION, RunRecord, load_record, record_from_dict  # noqa: E402
from pytest_rlbench.verdict.machine_load import OTHER_CORES, STEAL_CORES, cpu_snapshot, machine_metric  # noqa: E402
from pytest_rlbench.verdict.noise import DefaultTolerance, default_tolerance  # noqa: E402
from pytest_rlbench.verdict.session_pace import session_paces  # noqa: E402

SCENARIOS = ("unchanged", "contention", "slowdown", "slowwork")
BUSY_LOOP = "while True:\n    pass\n"
RUN_MARK = "GATE_ERROR_RATES_RUN"  # in every session's environment: finds what a session left behind
TICKS_PER_S = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


@dataclass
class RunResult:
    index: int
    outcome: str  # "passed", "failed", "inconclusive" or "error"
    exit_status: int | None
    seconds: float
    verdicts: list[str] = field(default_factory=list)  # "verdict: message" of each figure not passed
    settle: dict = field(default_factory=dict)  # what the wait before the session found
    machine: dict = field(default_factory=dict)  # busy and stolen cores over the whole session
    phases: dict = field(default_factory=dict)  # per gated phase: plain ratio, session pace, cores beside


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


def marked_processes(mark: str = RUN_MARK) -> list[str]:
    """"pid command" of each process whose environment carries ``mark`` (an earlier session's)."""
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if f"{mark}=".encode() not in fh.read():
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                command = fh.read().replace(b"\0", b" ").decode(errors="replace")[:120].strip()
            found.append(f"{entry} {command}")
        except (OSError, ValueError):
            continue
    return found


def busy_cores(seconds: float) -> float | None:
    """The machine's CPU use, in cores, over the next ``seconds`` (None without /proc/stat)."""
    before = cpu_snapshot()
    time.sleep(seconds)
    after = cpu_snapshot()
    if before is None or after is None:
        return None
    return (after.busy_ticks - before.busy_ticks) / ((after.wall_s - before.wall_s) * TICKS_PER_S)


def settle(quiet_cores: float, timeout: float) -> dict:
    """Wait until no earlier session's process is left and the machine is quiet (see the docstring)."""
    start = time.monotonic()
    leftovers = marked_processes()
    while marked_processes() and time.monotonic() - start < timeout:
        time.sleep(0.5)
    busy = busy_cores(2.0)
    while busy is not None and busy > quiet_cores and time.monotonic() - start < timeout:
        busy = busy_cores(2.0)
    still = marked_processes()
    return {"leftovers_at_start": leftovers, "left_after_wait": still, "waited_s": time.monotonic() - start,
            "busy_cores_before": busy}


def phase_figures(run: RunRecord, base: RunRecord) -> dict:
    """Per phase timed by both: the plain ratio of medians, the session's pace around it (the median
    ratio of its peers, where it has enough) and the cores used beside the session."""
    out = {}
    paces = session_paces(run, base)
    for phase in sorted(set(run.phases) & set(base.phases)):
        ours, theirs = run.phases[phase].seconds, base.phases[phase].seconds
        row = {"ratio": statistics.median(ours) / statistics.median(theirs)}
        if phase in paces:
            row["pace"] = paces[phase].factor
        for figure in (OTHER_CORES, STEAL_CORES):
            metric = run.metrics.get(machine_metric(figure, phase))
            if metric is not None and metric.value:
                row[figure] = metric.value[0]
        out[phase] = row
    return out


def record_of_report(report: dict) -> RunRecord:
    """The run record a session's JSON report holds (pytest_rlbench/reports/json_report.py): its description,
    each phase's rounds and each metric's samples (a session whose gate failed saves no baseline)."""
    phases = {
        phase: {"seconds": row["seconds"]["samples"], **({"inside_step": True} if row.get("inside_step") else {})}
        for phase, row in report["phases"].items()
        if row.get("seconds")
    }
    metrics = {
        name: {"value": m["samples"], "unit": m["unit"],
               "higher_is_better": PANEL_FIGURES.get(name.rpartition("/")[2], ("", False))[1]}
        for name, m in report["metrics"].items()
    }
    return record_from_dict({**report["run"], "phases": phases, "metrics": metrics, "format_version": FORMAT_VERSION})


def run_once(index: int, command: list[str], work: Path, name: str, env: dict[str, str], timeout: float) -> RunResult:
    report = work / f"{name}.report.json"
    env = {**env, RUN_MARK: name}
    before, start = cpu_snapshot(), time.monotonic()
    try:
        done = subprocess.run(command + [f"--rl-report={report}"], cwd=ROOT,
                              env=env, timeout=timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return RunResult(index, "error", None, time.monotonic() - start, [f"timed out after {timeout:g} s"])
    seconds, after = time.monotonic() - start, cpu_snapshot()
    machine = {}
    if before is not None and after is not None:
        elapsed = (after.wall_s - before.wall_s) * TICKS_PER_S
        machine = {"busy_cores": (after.busy_ticks - before.busy_ticks) / elapsed,
                   "steal_cores": (after.steal_ticks - before.steal_ticks) / elapsed}
    if done.returncode not in (0, 1) or not report.exists():
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        return RunResult(index, "error", done.returncode, seconds, [f"exit status {done.returncode}", *tail])
    data = json.loads(report.read_text())
    outcome, lines = outcome_of(data, "base")
    if done.returncode == 1 and outcome == "passed":  # a test failed for another reason than the gate
        outcome, lines = "error", ["exit status 1 with no failed figure", *done.stdout.strip().splitlines()[-5:]]
    phases = phase_figures(record_of_report(data), load_record(work / "base.json"))
    return RunResult(index, outcome, done.returncode, seconds, lines, machine=machine, phases=phases)


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


def scenario_env(
    scenario: str, slow_method: str, slowdown: float, slow_work: float = 0.10
) -> tuple[dict[str, str], list[str]]:
    env = dict(os.environ)
    if scenario not in ("slowdown", "slowwork"):
        return env, []
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCHMARKS), env.get("PYTHONPATH", "")) if p)
    fraction = slowdown if scenario == "slowdown" else slow_work
    env["GATE_SLOW_METHOD"], env["GATE_SLOWDOWN"] = slow_method, str(fraction)
    if scenario == "slowwork":
        env["GATE_SLOW_CPU_WORK"] = "1"
    return env, ["-p", "gate_slow_phase"]


def run_scenario(scenario: str, args: argparse.Namespace, baseline: Path, work: Path) -> ScenarioResult:
    env, plugin = scenario_env(scenario, args.slow_method, args.slowdown, args.slow_work)
    command = pytest_command([*args.pytest_arg, *plugin, f"--rl-baseline={baseline}"])
    result = ScenarioResult(scenario)
    for i in range(1, args.runs + 1):
        time.sleep(args.cool_down)
        waited = settle(args.quiet_cores, args.settle_timeout)
        if scenario == "contention":
            with cpu_contention(os.cpu_count() or 1):
                run = run_once(i, command, work, f"{scenario}-{i}", env, args.timeout)
        else:
            run = run_once(i, command, work, f"{scenario}-{i}", env, args.timeout)
        run.settle = waited
        result.runs.append(run)
        steal = run.machine.get("steal_cores")
        print(f"{scenario} run {i}/{args.runs}: {run.outcome} ({run.seconds:.0f} s, waited {waited['waited_s']:.0f} s, "
              f"{len(waited['leftovers_at_start'])} leftover processes, steal {steal if steal is None else round(steal, 3)})",
              flush=True)
        for line in run.verdicts:
            print(f"    {line}", flush=True)
    return result


def rejudge(work: Path, tolerance: float) -> list[str]:
    """The table recounted from the run records kept in ``work``, judged at ``tolerance`` as the gate
    judges a session (plain seconds, the session's pace, contention)."""
    from pytest_rlbench.verdict.compare import compare

    base = load_record(work / "base.json")
    results: dict[str, ScenarioResult] = {}
    runs = [(path, *path.name.split(".")[0].rsplit("-", 1)) for path in work.glob("*-*.report.json")]
    for path, scenario, index in sorted(runs, key=lambda run: (run[1], int(run[2]))):
        rows = compare(record_of_report(json.loads(path.read_text())), base, tolerance).comparisons
        verdicts = {c.verdict for c in rows}
        outcome = "failed" if "fail" in verdicts else "inconclusive" if "inconclusive" in verdicts else "passed"
        results.setdefault(scenario, ScenarioResult(scenario)).runs.append(RunResult(int(index), outcome, None, 0.0))
    return table([results[s] for s in SCENARIOS if s in results])


def tolerance_text(tolerance: float) -> str:
    """Which tolerance a recount applies, in words."""
    if isinstance(tolerance, DefaultTolerance):
        return f"tolerance {tolerance:g} (the CPU default)"
    return f"tolerance {tolerance:g}"


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
    parser.add_argument("--slowdown", type=float, default=0.25, help="fraction of the phase's time added (asleep)")
    parser.add_argument("--slow-work", type=float, default=0.10,
                        help="fraction of the phase's time added as real CPU work (scenario slowwork)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds one pytest session may take")
    parser.add_argument("--pytest-arg", action="append", default=[], help="passed to every pytest session")
    parser.add_argument("--out", type=Path, default=Path("gate_error_rates.json"), help="the JSON table")
    parser.add_argument("--quiet-cores", type=float, default=0.3, help="CPU use below which the machine is quiet")
    parser.add_argument("--settle-timeout", type=float, default=60, help="seconds to wait for quiescence")
    parser.add_argument("--cool-down", type=float, default=0.0, help="seconds to idle before each session")
    parser.add_argument("--baseline-sessions", type=int, default=1,
                        help="sessions that save the baseline, each over the last (it keeps up to 3 sessions' blocks)")
    parser.add_argument("--rejudge", type=Path, help="a work directory to recount (no session is run)")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="the tolerance of the recount (default: the CPU default; the sessions use theirs)")
    args = parser.parse_args(argv)
    if args.rejudge is not None:
        tolerance = args.tolerance if args.tolerance is not None else default_tolerance(gpu=False)
        print(tolerance_text(tolerance))
        print("\n".join(rejudge(args.rejudge, tolerance)))
        return 0
    work = Path(tempfile.mkdtemp(prefix="gate-error-rates-"))
    baseline = work / "base.json"
    print(f"saving the baseline to {baseline} (every session's report is kept in {work})", flush=True)
    for session in range(args.baseline_sessions):  # saved again over itself: it keeps each session's blocks
        settle(args.quiet_cores, args.settle_timeout)
        saved = subprocess.run(pytest_command([*args.pytest_arg, f"--rl-save-baseline={baseline}"]), cwd=ROOT,
                               env={**os.environ, RUN_MARK: "base"}, timeout=args.timeout, capture_output=True,
                               text=True)
        if saved.returncode != 0 or not baseline.exists():
            print((saved.stdout + saved.stderr)[-3000:], file=sys.stderr)
            print(f"baseline session {session + 1} failed (exit status {saved.returncode})", file=sys.stderr)
            return 2
    results = [run_scenario(s, args, baseline, work) for s in args.scenarios]
    lines = table(results)
    print("\n".join(lines))
    tolerance = args.tolerance if args.tolerance is not None else default_tolerance(gpu=False)
    recounted = [tolerance_text(tolerance), *rejudge(work, tolerance)]
    print("the same sessions recounted from their records, " + "\n".join(recounted))
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    out = {"settings": settings, "cpus": os.cpu_count(), "work": str(work), "table": lines, "recounted": recounted,
           "scenarios": [asdict(r) for r in results]}
    args.out.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
