"""What the machine itself did around a phase's timed rounds, so that a gate can tell a slower phase
from a slower machine.

Same-code sessions on a small cloud VM run up to 1.65x slower than the baseline's session, every
phase together (docs/benchmarks.md, "The gate's error rates"): the host, not the code. Two figures
per phase separate that from a regression and from CPU contention inside the machine:

- ``calibration``: the seconds of a fixed workload (``calibration_round``: torch matmuls, a pass over
  4 MB, small matmuls of a tiny model's width, a Python loop; none of it code under test; the fastest
  of 3 passes) timed just before each timed round where the phase runs: inside each of the trainer's
  Ray workers at once (``workers_calibration``; the slowest worker's figure), on the process and
  torch thread settings the phase uses, else in this process. A slower host slows it as much as the
  phases; a slower phase does not slow it. Timed in the driver instead, right after a phase, it came
  out bimodal (5 or 12 ms, by which phase ran before it; docs/benchmarks.md, "The gate's error
  rates"); timed in the workers it has no second mode. Whether it follows the host's drift is what
  ``benchmarks/gate_calibration_probe.py`` measures.
- ``other_cores`` and ``steal_cores``: the CPU used during the rounds by processes outside this
  session (this process and its descendants: the embedded Ray and its workers) and the CPU the
  hypervisor took from this VM (/proc/stat's steal), each in cores on average, read from /proc
  (Linux; None elsewhere). A busy process beside the session shows in the first; the calibration
  alone could not tell it from a slower host.
- ``own_cores``: the CPU the session's own processes and threads (all but the calibrating threads and
  the thread that asks for them) used during the calibrations, in cores. A change that keeps workers
  busy between rounds slows the calibration as it slows the phase; dividing by that calibration would
  hide the regression, so the gate falls back to plain seconds above ``verdict.OWN_BUSY_CORES``.

They are recorded as the run's metrics ``machine/<figure>/<phase>`` (``machine_metric``), so a saved
baseline keeps its own session's figures for ``pytest_rlbench.verdict`` to compare with.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

MACHINE = "machine"  # the metric family of these figures: never judged on its own
CALIBRATION = "calibration_s"
OTHER_CORES = "other_cores"
STEAL_CORES = "steal_cores"
OWN_CORES = "own_cores"


def machine_metric(figure: str, phase: str) -> str:
    """The run metric id of one machine figure of a phase: machine/<figure>/<phase>."""
    return f"{MACHINE}/{figure}/{phase}"


# ----------------------------------------------------------------------------- the calibration
CALIBRATION_REPEATS = 3  # a round's calibration is the fastest of these: one preempted pass does not count


@lru_cache(maxsize=1)
def _calibration_inputs() -> tuple[Any, ...]:
    import torch

    generator = torch.Generator().manual_seed(0)
    square = torch.randn(192, 192, generator=generator)  # the width of the tiny model's MLP
    narrow = torch.randn(64, 192, generator=generator)  # its hidden size: small ops, dispatch-bound
    long = torch.randn(1_000_000, generator=generator)  # 4 MB, past the L2 cache
    return square, narrow, long, torch.empty_like(long)  # written in place: no page faults in the timing


def calibration_pass() -> float:
    """Seconds of one pass of a fixed workload (about 8 ms on a quiet 2-core VM): compute-bound
    matmuls, a memory-bound pass over 4 MB (into a buffer allocated once), 200 small matmuls of a tiny
    model's width (op dispatch, what a CPU phase of the tiny model mostly is) and interpreter work.
    No code under test. On the calling thread's own torch settings: in a CPU worker those its phases
    run with (one thread, trainer/workers/train_worker.py)."""
    import torch

    square, narrow, long, out = _calibration_inputs()
    start = time.perf_counter()
    x = square
    for _ in range(8):
        x = torch.tanh(x @ square)
    total = float(x.sum())
    for _ in range(4):
        torch.mul(long, 1.0001, out=out)
        total += float(out.sum())
    y = narrow[:8]
    for _ in range(100):
        y = torch.nn.functional.silu(y @ square) @ square.T
    for i in range(20_000):
        total += i & 7
    return time.perf_counter() - start


def calibration_round() -> float:
    """One calibration: the fastest of ``CALIBRATION_REPEATS`` passes, on the calling thread."""
    return min(calibration_pass() for _ in range(CALIBRATION_REPEATS))


def worker_calibration(worker: Any) -> tuple[float, int]:
    """A calibration inside a Ray actor (``actor.__ray_call__.remote(worker_calibration)``: Ray passes
    the actor's instance first) and the native id of the thread that ran it."""
    return calibration_round(), threading.get_native_id()


Calibrate = Callable[[], tuple[float, list[int]]]  # one calibration: (seconds, the threads that ran it)


def driver_calibration() -> tuple[float, list[int]]:
    """A calibration in this process, for phases that run here (``rl_bench`` without a trainer), on
    one thread as in a CPU worker: the work stays on the thread whose CPU is left out of
    ``own_cores`` (torch's other threads would count as the session's load), and torch's thread pool,
    spinning at its barriers, slows 10-100x when a core is taken from it."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return calibration_round(), [threading.get_native_id()]
    finally:
        torch.set_num_threads(threads)


def workers_calibration(group: Any) -> Calibrate:
    """A calibration inside every Ray actor of a ``trainer.driver.worker_group.WorkerGroup`` at once,
    for phases that run in them: each on its own process and torch settings, while the others do the
    same, as in a phase. The slowest worker's seconds: a phase waits for it at every collective. The
    group's own wait bounds it: a dead or hung worker fails it as it would fail the phase."""

    def calibrate() -> tuple[float, list[int]]:
        refs = [actor.__ray_call__.remote(worker_calibration) for actor in group.workers]
        results = group.wait(refs, "the machine's calibration")
        return max(seconds for seconds, _ in results), [tid for _, tid in results]

    return calibrate


# ----------------------------------------------------------------------------- CPU use from /proc
@dataclass(frozen=True)
class CpuSnapshot:
    """The machine's CPU counters at one moment, in clock ticks (os.sysconf("SC_CLK_TCK") per second)."""

    wall_s: float
    busy_ticks: int  # user + nice + system + irq + softirq of every CPU
    steal_ticks: int
    ours: dict[int, int]  # pid -> CPU ticks of this process and each descendant, its reaped children's included


def _stat_fields(pid: int | str) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()  # after the command name: state, ppid, ...
    except (OSError, IndexError):
        return None


def _process_table() -> Iterator[tuple[int, int, int]]:
    """(pid, ppid, ticks) of every process readable in /proc: utime + stime + cutime + cstime (proc(5)),
    so that a child that ran and exited (a Ray worker, a subprocess) still counts, in its parent."""
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat_fields(entry)) is not None and len(fields) > 14:
            yield int(entry), int(fields[1]), sum(int(v) for v in fields[11:15])


def descendants_ticks(table: list[tuple[int, int, int]], root: int) -> dict[int, int]:
    """CPU ticks of ``root`` and every process descending from it, by pid, from ``_process_table`` rows."""
    children: dict[int, list[int]] = {}
    ticks = {}
    for pid, ppid, used in table:
        children.setdefault(ppid, []).append(pid)
        ticks[pid] = used
    out: dict[int, int] = {}
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        if pid in ticks and pid not in out:
            out[pid] = ticks[pid]
            frontier.extend(children.get(pid, ()))
    return out


def cpu_snapshot() -> CpuSnapshot | None:
    """The counters now, or None where /proc/stat cannot be read (not Linux)."""
    try:
        with open("/proc/stat", encoding="utf-8") as fh:
            fields = [int(v) for v in fh.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    ours = descendants_ticks(list(_process_table()), os.getpid())
    return CpuSnapshot(time.monotonic(), user + nice + system + irq + softirq, steal, ours)


def session_pids() -> list[int]:
    """This process and its descendants, now."""
    return list(descendants_ticks(list(_process_table()), os.getpid()))


def thread_cpu_ns(pids: list[int]) -> dict[int, int]:
    """tid -> nanoseconds on a CPU (/proc/PID/task/TID/schedstat's first field: nanosecond counts, where
    /proc/PID/stat's ticks are too coarse for a 10 ms window) of every thread of ``pids``."""
    out: dict[int, int] = {}
    for pid in pids:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except (OSError, ValueError):
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="utf-8") as fh:
                    out[tid] = int(fh.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return out


def busy_seconds(before: dict[int, int], after: dict[int, int], skip: Sequence[int] = ()) -> float:
    """CPU seconds the threads but ``skip`` used between two ``thread_cpu_ns`` readings (a new thread:
    all of its own)."""
    return sum(ns - before.get(tid, 0) for tid, ns in after.items() if tid not in skip) / 1e9


def cores_used(before: CpuSnapshot, after: CpuSnapshot, ticks_per_s: float) -> tuple[float, float]:
    """(cores used by processes outside the session, cores stolen by the hypervisor) on average between
    two snapshots. The session's ticks are its totals' difference: a process of ours that ended in
    between moved its ticks, the ones before the window too, into its parent's reaped-children figure."""
    elapsed = max(after.wall_s - before.wall_s, 1e-9) * ticks_per_s
    ours = sum(after.ours.values()) - sum(before.ours.values())
    other = max(after.busy_ticks - before.busy_ticks - ours, 0)
    return other / elapsed, max(after.steal_ticks - before.steal_ticks, 0) / elapsed


class MachineWatch:
    """The machine figures of one phase: ``calibrate()`` before each timed round, ``start()`` and
    ``stop()`` around the rounds; ``figures(timed)`` then gives the metric values, keyed by figure name,
    with the calibrations of the last ``timed`` rounds. No untimed calibration warms up: the first of a
    round's passes builds the inputs in a process that has none yet, and the fastest pass counts."""

    def __init__(self, calibrate: Calibrate = driver_calibration) -> None:
        self.calibrations: list[float] = []
        self._own: list[tuple[float, float] | None] = []  # per calibration: (our other CPU s, wall s)
        self._start: CpuSnapshot | None = None
        self._load: tuple[float, float] | None = None
        self._calibrate = calibrate  # where the phase runs: this process, or the trainer's workers

    def calibrate(self) -> None:
        """One calibration, and what the session's other threads and processes used meanwhile."""
        pids = session_pids()
        before = thread_cpu_ns(pids)
        start = time.perf_counter()
        seconds, threads = self._calibrate()
        after = thread_cpu_ns(pids)
        wall = time.perf_counter() - start
        self.calibrations.append(seconds)
        # this thread's own CPU meanwhile is the reading of /proc and the calls to the workers: not load
        skip = [*threads, threading.get_native_id()]
        self._own.append((busy_seconds(before, after, skip), wall) if after else None)

    def start(self) -> None:
        self._start = cpu_snapshot()

    def stop(self) -> None:
        end = cpu_snapshot()
        if self._start is not None and end is not None:
            self._load = cores_used(self._start, end, float(os.sysconf("SC_CLK_TCK")))

    def figures(self, timed: int) -> dict[str, list[float]]:
        out = {CALIBRATION: self.calibrations[-timed:]} if timed and len(self.calibrations) >= timed else {}
        own = self._own[-timed:] if out else []
        if own and all(o is not None for o in own):
            out[OWN_CORES] = [sum(o[0] for o in own if o) / max(sum(o[1] for o in own if o), 1e-9)]
        if self._load is not None:
            out[OTHER_CORES], out[STEAL_CORES] = [self._load[0]], [self._load[1]]
        return out
