"""What the machine did beside a phase's timed rounds, so that a gate can tell a slower phase from
CPU contention.

Around each phase's rounds (``MachineWatch``: ``start()`` before the first round, ``stop()`` after the
last) the driver reads from /proc (Linux; nothing is recorded elsewhere):

- ``other_cores``: the CPU used during the rounds by processes outside this session (this process and
  its descendants: the embedded Ray and its workers), in cores on average. A busy process beside the
  session slows its phases as a regression would; ``pytest_rlbench.verdict.judge`` then lets plain seconds
  decide (the session's pace is not applied) and names the contention in a failure.
- ``steal_cores``: the CPU the hypervisor took from this VM (/proc/stat's steal), in cores on average;
  shown beside a failure.

They are recorded as the run's metrics ``machine/<figure>/<phase>`` (``machine_metric``), so a saved
baseline keeps its own session's figures for ``pytest_rlbench.verdict.judge`` to compare with. (A fixed
workload timed before each round, to divide the phases by the machine's speed, was tried and did not
follow the phases' drift between sessions: docs/benchmarks.md, "The gate's error rates"; a session's
drift is read from its own phases instead, ``pytest_rlbench.verdict.session_pace``.)
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

MACHINE = "machine"  # the metric family of these figures: never judged on its own
OTHER_CORES = "other_cores"
STEAL_CORES = "steal_cores"


def machine_metric(figure: str, phase: str) -> str:
    """The run metric id of one machine figure of a phase: machine/<figure>/<phase>."""
    return f"{MACHINE}/{figure}/{phase}"


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


def cores_used(before: CpuSnapshot, after: CpuSnapshot, ticks_per_s: float) -> tuple[float, float]:
    """(cores used by processes outside the session, cores stolen by the hypervisor) on average between
    two snapshots. The session's ticks are its totals' difference: a process of ours that ended in
    between moved its ticks, the ones before the window too, into its parent's reaped-children figure."""
    elapsed = max(after.wall_s - before.wall_s, 1e-9) * ticks_per_s
    ours = sum(after.ours.values()) - sum(before.ours.values())
    other = max(after.busy_ticks - before.busy_ticks - ours, 0)
    return other / elapsed, max(after.steal_ticks - before.steal_ticks, 0) / elapsed


class MachineWatch:
    """The machine figures of one phase: ``start()`` and ``stop()`` around its rounds; ``figures()`` then
    gives the metric values, keyed by figure name (none where /proc could not be read)."""

    def __init__(self) -> None:
        self._start: CpuSnapshot | None = None
        self._load: tuple[float, float] | None = None

    def start(self) -> None:
        self._start = cpu_snapshot()

    def stop(self) -> None:
        end = cpu_snapshot()
        if self._start is not None and end is not None:
            self._load = cores_used(self._start, end, float(os.sysconf("SC_CLK_TCK")))

    def figures(self) -> dict[str, list[float]]:
        if self._load is None:
            return {}
        return {OTHER_CORES: [self._load[0]], STEAL_CORES: [self._load[1]]}
