"""What the machine did beside a phase's timed rounds, so that a gate can tell a slower phase from
CPU contention or a slower GPU.

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

On GPUs the session reads the GPU telemetry of each timed round through NVML
(``pytest_rlbench.session.gpu_watch``) and keeps it as the run's metrics ``gpu/<figure>/<phase>``, one
value per round. A phase that ran at a lower SM clock than its baseline's did less work per second
whatever the code: where the clocks' ratio accounts for its slowdown (``clocks_explain``), the verdict
is "inconclusive" (reason "GPU clocks"), never a failure or a silent pass. Other processes on the
session's GPUs are named beside a failure, as CPU contention is.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from pytest_rlbench.records.metrics import GPU

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
    gives the metric values, keyed by figure name (none where /proc could not be read), and ``metrics``
    the run metrics (a round watch, ``pytest_rlbench.session.bench.RoundWatch``)."""

    def __init__(self) -> None:
        self._start: CpuSnapshot | None = None
        self._load: tuple[float, float] | None = None

    def start(self) -> None:
        self._start = cpu_snapshot()

    def stop(self) -> None:
        end = cpu_snapshot()
        if self._start is not None and end is not None:
            self._load = cores_used(self._start, end, float(os.sysconf("SC_CLK_TCK")))

    def mark_start(self) -> None:
        """Rounds are not told apart: the load is read over all of them."""

    def mark_end(self) -> None:
        """Rounds are not told apart: the load is read over all of them."""

    def figures(self) -> dict[str, list[float]]:
        if self._load is None:
            return {}
        return {OTHER_CORES: [self._load[0]], STEAL_CORES: [self._load[1]]}

    def metrics(self, phase: str, warmup: int) -> list[tuple[str, list[float], str]]:
        """(metric id, values, unit) of each figure, over all rounds (warm-up ones too)."""
        return [(machine_metric(figure, phase), values, "cores") for figure, values in self.figures().items()]


# ----------------------------------------------------------------------------- GPU telemetry
# GPU (records.metrics): the metric family of these figures, never judged on its own
SM_CLOCK = "sm_clock_mhz"
MEM_CLOCK = "mem_clock_mhz"
POWER = "power_w"
POWER_CAP = "power_cap_w"
TEMPERATURE = "temperature_c"
POWER_CAPPED = "power_capped"  # 1 where the power cap (or a power brake) held the clocks in the round
THERMAL = "thermal_slowdown"  # 1 where a thermal slowdown did
OTHER_PROCESSES = "other_processes"
GPU_UNITS = {SM_CLOCK: "MHz", MEM_CLOCK: "MHz", POWER: "W", POWER_CAP: "W", TEMPERATURE: "C"}

# NVML's clock event reasons (nvmlClocksEventReason*), by bit, in words.
THROTTLE_BITS: dict[int, str] = {
    0x4: "power cap",
    0x8: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "power brake",
}
POWER_REASONS = frozenset({"power cap", "power brake"})
THERMAL_REASONS = frozenset({"software thermal slowdown", "hardware thermal slowdown", "hardware slowdown"})

# The SM clock must be this much lower in the run than in its baseline before a slower phase is put
# down to the clocks: the median clock of update_actor (at the 700 W power cap) moved by 2.4% between
# unchanged sessions on H100s (docs/benchmarks.md, "The GPU gate's error rates"), and a regression
# that adds GPU work under the cap lowers the clock too (5% more update_actor work: 0.8-2.4% lower).
CLOCK_EXPLAINS_FROM = 0.03


@dataclass(frozen=True)
class RoundTelemetry:
    """One timed round: the median of its samples' SM and memory clocks (the slowest GPU's), the mean
    power (per GPU) and the cap, the hottest temperature, the throttle reasons seen and the number of
    other processes computing on the GPUs."""

    sm_clock_mhz: float
    mem_clock_mhz: float
    power_w: float
    power_cap_w: float | None
    temperature_c: float
    throttle: tuple[str, ...]
    other_processes: int

    def figures(self) -> dict[str, float]:
        out = {
            SM_CLOCK: self.sm_clock_mhz,
            MEM_CLOCK: self.mem_clock_mhz,
            POWER: self.power_w,
            TEMPERATURE: self.temperature_c,
            POWER_CAPPED: float(bool(POWER_REASONS & set(self.throttle))),
            THERMAL: float(bool(THERMAL_REASONS & set(self.throttle))),
            OTHER_PROCESSES: float(self.other_processes),
        }
        if self.power_cap_w is not None:
            out[POWER_CAP] = self.power_cap_w
        return out


def throttle_names(reasons: int) -> tuple[str, ...]:
    """The throttle reasons set in NVML's bitmask, in words (idle and sync boost left out)."""
    return tuple(name for bit, name in THROTTLE_BITS.items() if reasons & bit)


def gpu_metric(figure: str, phase: str) -> str:
    """The run metric id of one GPU figure of a phase: gpu/<figure>/<phase>."""
    return f"{GPU}/{figure}/{phase}"


def per_round_figures(rounds: Sequence[RoundTelemetry]) -> dict[str, list[float]]:
    """Each figure's values, one per round (a figure some round lacks is left out)."""
    if not rounds:
        return {}
    keys = set.intersection(*(set(r.figures()) for r in rounds))
    return {k: [r.figures()[k] for r in rounds] for k in sorted(keys)}


@dataclass(frozen=True)
class GpuEvidence:
    """A phase's GPU telemetry in the run and in its baseline's session (None where not recorded)."""

    sm_clock: float | None = None  # the run's median SM clock over its rounds, MHz
    base_sm_clock: float | None = None
    power_capped: float | None = None  # the share of the run's rounds held by the power cap
    base_power_capped: float | None = None
    thermal: float | None = None  # the share of the run's rounds under a thermal slowdown
    other_processes: float | None = None  # the most other processes seen on the GPUs in a round

    @property
    def clock_ratio(self) -> float | None:
        """Baseline's SM clock over the run's: above 1 where the run's GPU ran slower."""
        if not self.sm_clock or not self.base_sm_clock:
            return None
        return self.base_sm_clock / self.sm_clock

    def describe(self) -> str:
        """The figures in words, for a verdict."""
        parts = []
        if self.sm_clock is not None and self.base_sm_clock is not None:
            parts.append(f"SM clock {self.sm_clock:.0f} vs {self.base_sm_clock:.0f} MHz")
        if self.power_capped:
            parts.append(f"power cap in {self.power_capped:.0%} of rounds")
        if self.thermal:
            parts.append(f"thermal slowdown in {self.thermal:.0%} of rounds")
        if self.other_processes:
            parts.append(f"{self.other_processes:.0f} other process(es) on the GPU")
        return ", ".join(parts)


def evidence(
    run_metrics: Mapping[str, Sequence[float]], base_metrics: Mapping[str, Sequence[float]], phase: str
) -> GpuEvidence | None:
    """The GpuEvidence of ``phase`` from two records' metrics (values per round); None where the run
    recorded no telemetry for it."""

    def median(metrics: Mapping[str, Sequence[float]], figure: str) -> float | None:
        values = metrics.get(gpu_metric(figure, phase))
        return statistics.median(values) if values else None

    def share(metrics: Mapping[str, Sequence[float]], figure: str) -> float | None:
        values = metrics.get(gpu_metric(figure, phase))
        return sum(values) / len(values) if values else None

    clock = median(run_metrics, SM_CLOCK)
    if clock is None:
        return None
    others = run_metrics.get(gpu_metric(OTHER_PROCESSES, phase))
    return GpuEvidence(
        sm_clock=clock,
        base_sm_clock=median(base_metrics, SM_CLOCK),
        power_capped=share(run_metrics, POWER_CAPPED),
        base_power_capped=share(base_metrics, POWER_CAPPED),
        thermal=share(run_metrics, THERMAL),
        other_processes=max(others) if others else None,
    )


def clocks_explain(ratio: float, tolerance: float, gpu: GpuEvidence) -> bool:
    """Whether the run's lower SM clock accounts for a time ``ratio`` (run / baseline) past the
    tolerance: the clocks are at least ``CLOCK_EXPLAINS_FROM`` lower, and the time scaled by them
    (ratio / clock ratio: what the phase would take at the baseline's clock, were it bound by the SM
    clock) is within the tolerance."""
    clock_ratio = gpu.clock_ratio
    if clock_ratio is None or clock_ratio < 1 + CLOCK_EXPLAINS_FROM:
        return False
    return ratio / clock_ratio <= 1 + tolerance
