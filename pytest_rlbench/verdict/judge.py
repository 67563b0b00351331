"""One metric of a run judged against a baseline's: pass, fail (a regression), inconclusive, or a
row listed beside without a verdict of its own.

In a gate, a figure is a regression only when both
1. its median is past the tolerance: a time (or any lower-is-better figure) above baseline x (1 +
   tolerance), a throughput (any higher-is-better figure) below baseline x (1 - tolerance); and
2. the difference is above the noise floor of its phase (``noise.phase_floor``, per device
   kind): for a figure derived from a phase's time, the difference in seconds it stands for
   (the run's time x (1 - ratio) or x (1 - 1 / ratio)) must exceed the floor; and
3. the difference is statistically real: the one-sided Mann-Whitney U test of the run's rounds
   against the baseline's (``rank_test``) gives p < ``ALPHA`` (0.01). Where the two sides' round
   counts cannot reach that level at all (n = m = 4 gives at best 1/70 = 0.014) the verdict is
   "inconclusive", naming the rounds per side that would (5: 1/252 = 0.004), and the session does
   not fail for it. Where they can and do not (p >= 0.01), it passes: the rounds overlap too much to
   call the difference real.
With one figure on either side (a published baseline gives one) no rank test is possible: the
threshold and the floor decide, and the verdict says it rests on one figure.

A strict level because a session judges a dozen figures at once: at 0.01 an unchanged run of
twelve phases is wrongly failed by chance in about 1 session in 8 at worst (1 - 0.99^12), and far
less where the tolerance already passes most of them.

A phase's time on CPU workers, judged against a baseline on the same machine, is read beside two
things the session knows of itself:
- CPU contention: where processes outside the session used ``CONTENTION_CORES`` or more during the
  phase's rounds, in the run or in the baseline's session (``MachineEvidence``, from
  ``pytest_rlbench.verdict.machine_load``), the verdict in plain seconds stands, and a failure (or a
  difference the rank test could not call real) names the contention;
- otherwise the session's pace (``pytest_rlbench.verdict.session_pace``: the median ratio of its other phases
  to their baselines): a phase that fails in plain seconds is judged again with its rounds divided by
  that pace. A fail there too is a regression; a pass or inconclusive there leaves the phase
  "inconclusive" (reason "session slower"), not failing the session: every phase slowed alike,
  which one session cannot tell from a slower host. Unless the phase is more than
  ``HOST_DRIFT_LIMIT`` times slower in seconds: then it fails whatever its peers did. The pace only
  excuses: a phase within the tolerance in seconds passes however fast its peers ran (judged against
  faster peers, 11 of 20 same-code sessions failed in their benchmarks, docs/benchmarks.md "The
  median block"), so a baseline saved in a slow session hides a regression up to that slowness;
- and a failure must reproduce: where its gate timed the phase again at the end of the session
  (``retimed``, ``pytest_rlbench.verdict.retiming``), those rounds are judged by the same rules, paced by the
  peers timed again beside them (``pace_again``); not failing there leaves the phase "inconclusive"
  (reason "not reproduced"). The baseline's figure is then its median block of rounds
  (``retiming.bar_block``, applied by ``pytest_rlbench.verdict.compare``).
A failure without contention lists the CPU used beside the rounds, for the record.
Where both sessions timed the phase side by side with its peers (``SideBySide``: one round of every
gated phase in turn, pass after pass, at the session's end), that stands in for the pace and the
re-timing (``against_side_by_side``): a phase past the tolerance in seconds is judged again on those
rounds, each divided by the host's speed in its pass (read from its peers), by the tolerance, the floor
and the rank test. Slower there too: a regression; not: "inconclusive" ("session slower"), unless
past ``HOST_DRIFT_LIMIT`` (``GPU_HOST_DRIFT_LIMIT`` on GPUs, where a session is timed side by side
only if every phase waits on the host). Within the tolerance in seconds but slower there ("slower beside its peers"):
a failure where every peer did the same counted work as in the baseline, or the phase did more, else
"inconclusive" (peers the code made faster look the same). The tolerance is then not widened to the baseline's own spread of blocks.
The default tolerance (``noise.default_tolerance``) is 0.15 on CPU workers and 0.10 on GPUs, where
the phases with a measured tolerance of their own get theirs: against a baseline saved on another
machine of the kind ``noise.GPU_PHASE_TOLERANCES`` (3-4% for generation, 10% for step and
old_log_prob, 12% for ref, 21% for update_actor), against one saved on the machine itself
``noise.GPU_SAME_MACHINE_TOLERANCES`` (3%, 6%, 8%, 8%, 7%); a tolerance from --rl-tolerance, the ini
file or the baseline file always wins.

A GPU phase's time is read beside the GPU telemetry of both sessions' rounds (``GpuEvidence``,
``pytest_rlbench.verdict.machine_load``): a failure that the run's lower SM clock accounts for is
"inconclusive" (reason "GPU clocks"), other processes on the GPU are named as contention, and any other
failure lists the clocks it ran at.

Last, a phase's time is read beside its counted work (``WorkEvidence``): the ATen ops and FLOPs it
dispatched in one untimed round after its timed ones (``trainer.work_counts``,
``pytest_rlbench.session.bench``), kept as the run's metrics ``work/ops/<phase>`` and
``work/flops/<phase>``, evidence never judged on their own; on GPUs also what the phase asked of the
GPU (``DEVICE_KINDS``: kernel launches, graph replays, kernels run, copies, host syncs, collectives).
The counts repeat exactly across rounds and sessions (the ops and FLOPs on the default CPU workload,
every kind at step16x8 on GPUs, across machines), so a count that moved is the code's doing. They
decide what the time alone cannot:
- a time slower in seconds that the session's pace, the re-timing or the GPU clocks left
  "inconclusive" fails (reason "more work") where the phase dispatched more than ``WORK_ALLOWANCE``
  more than its baseline, and passes (reason "same work") where its counts are within that allowance:
  the same work ran slower with every phase alike, or for a few seconds only, which is the machine;
- a time within the tolerance fails as "more work" where the phase dispatched more and its median,
  divided by the session's pace (on CPU workers), is slower than the baseline's by more than the
  noise floor: a regression too small for the tolerance that the counts show is the code's. The work
  is the evidence and the time says it cost something, by however much: requiring the time to be
  slower by a margin as well missed the regressions the counts are for (a 10% slower phase by real
  CPU work, +6% ops, passed 6 times in 15 at 1.09x; a 5% slower update_actor on a GPU came out at
  1.03-1.09x its baselines). The medians, not the rank test: one slow round of the baseline's (a 10%
  slowdown of old_log_prob, 0.134-0.147 s against 0.122-0.161 s) must not hide it;
- a time past the tolerance and the floor in seconds that the rank test of a few rounds could not
  tell from the baseline's (reason "not significant") fails as "more work" where the phase dispatched
  more, whatever side by side says: on a 2-core CPU VM a 10% slower old_log_prob by real work came out
  at 1.19-1.24x in seconds (p = 0.05-0.08) and 1.00-1.05x side by side, with 5-6% more ops.
Counts decide only between counted rounds that did the same work: a phase whose rounds do work of
their own (a generation, the step) also keeps what its counted round did (``ROUND_WORK``: response
tokens, decode steps); where the run's and the baseline's differ (responses that end at EOS sampled
to other lengths), its counts decide nothing and the verdict says why (``WorkEvidence.comparable``).
A baseline saved before these were kept is read on its counts alone.
The counters cannot see a slower kernel doing the same work: that is left to the time, and a change
that slows every kernel alike (fewer threads, a slower build) passes as the machine's.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Literal

from pytest_rlbench.records.metrics import FAMILIES, TIMING, family_of, format_value, metric_label
from pytest_rlbench.records.record import RunRecord
from pytest_rlbench.verdict.derived import Figure
from pytest_rlbench.verdict.machine_load import GpuEvidence, clocks_explain
from pytest_rlbench.verdict.noise import DefaultTolerance, phase_floor, value_floor
from pytest_rlbench.verdict.rank_test import p_greater, rounds_needed, smallest_p
from pytest_rlbench.verdict.session_pace import SessionPace, SideBySide

ALPHA = 0.01  # the one-sided level of the rank test
# Average cores used by processes outside the session during a phase's rounds from which its timing
# counts as taken under CPU contention (docs/benchmarks.md, "Where the gate's constants come from").
CONTENTION_CORES = 0.25
# A phase slower than this in plain seconds fails even where every phase of the session slowed alike
# (``SessionPace``): past the largest whole-session drift measured on a quiet host (docs/benchmarks.md, "Where the gate's constants come from").
HOST_DRIFT_LIMIT = 1.7
# The same on GPUs, for the phases timed side by side there (those that wait on the host): 18 unchanged
# sessions of the embedded default's tiny model on five H200s moved a phase by up to 2.02x between two
# sessions (generate_sequences; old_log_prob 1.79x, gen 1.69x; docs/benchmarks.md, "The GPU gate side by side").
GPU_HOST_DRIFT_LIMIT = 2.2


def host_drift_limit(device: str) -> float:
    """``HOST_DRIFT_LIMIT`` on CPU workers, ``GPU_HOST_DRIFT_LIMIT`` on GPUs."""
    return GPU_HOST_DRIFT_LIMIT if device == "gpu" else HOST_DRIFT_LIMIT

# How far counted work may move and still count as the same. On the default workload the counts
# repeat exactly (step's FLOPs move 0.5% from batch to batch; under fsdp2, update_actor's ops 2 in
# 1,401 from call to call), but a change of a few ops need not explain a slower time: turning on
# gradient checkpointing added 1.1-1.2% ops (no FLOPs) to gen and old_log_prob, whose 1.2-1.3x
# were the host's (not reproduced when re-timed); at 1% both failed as "more work".
WORK_ALLOWANCE = 0.05
WORK = "work"  # the metric family of counted work: evidence, never judged on its own
OPS = "ops"
FLOPS = "flops"
# What a phase asked of the GPU (trainer.work_counts.WorkCounts' device fields), each with its words
DEVICE_KINDS: dict[str, str] = {
    "launches": "kernel launches",
    "graph_replays": "graph replays",
    "kernels": "kernels run",
    "copies": "copies",
    "syncs": "host syncs",
    "collectives": "collectives",
}
WORK_KINDS = (OPS, FLOPS, *DEVICE_KINDS)  # every count of a phase's work, in the order verdicts name them
# The counts that decide a verdict: every kind. The ATen ops and FLOPs repeat exactly across sessions on
# the default CPU workload; on GPUs every count of every step16x8 phase (ops, FLOPs, launches, graph
# replays, kernels run, copies, host syncs, collectives) was the same in every session counted, on H100
# and H200 machines alike (docs/benchmarks.md, "Counted work decides on GPUs"). A GPU count can still
# move where the work does (responses that end at EOS): the counted rounds' own work (ROUND_WORK) must
# match for the counts to decide.
DECIDING_KINDS = WORK_KINDS
# What a counted round of a phase that generates did, beside its counts (TokenCounts' fields, each with
# its words and unit): where responses end at EOS, a round that sampled longer responses dispatches
# more, and the counts then say nothing of the code.
ROUND_WORK: dict[str, tuple[str, str]] = {
    "response_tokens": ("response tokens", "tokens"),
    "decode_steps": ("decode steps", "steps"),
}
# The inconclusive reasons of a phase slower in seconds that more counted work makes a regression.
SLOWER_YET_EXCUSED = ("session slower", "not reproduced", "GPU clocks")
# The inconclusive reason of a phase within the tolerance in seconds but slower beside its peers timed
# side by side (``against_side_by_side``): more counted work makes it a regression too, the same work
# does not excuse it (a wait or a slower kernel does the same work).
SLOWER_BESIDE_PEERS = "slower beside its peers"
# The reason of a phase past the tolerance and the floor in seconds whose rounds the rank test could not
# tell from the baseline's: with more counted work it is a regression too (the counts are certain).
NOT_SIGNIFICANT = "not significant"

Verdict = Literal["pass", "fail", "inconclusive", "reference", "not run"]
Mode = Literal["gate", "reference"]


@dataclass(frozen=True)
class Comparison:
    """One metric of a run against one baseline."""

    metric: str  # metric id, e.g. "timing_s/update_actor"
    phase: str | None
    measured: float | None
    baseline: float | None
    baseline_source: str  # the baseline's name
    ratio: float | None  # measured / baseline
    tolerance: float
    verdict: Verdict
    # "within tolerance", "below the noise floor", "not significant", "too few rounds",
    # "session slower", "not reproduced", "GPU clocks", "same work", "more work", "slower", "lower",
    # "higher", "missing", "not run", "reference"
    reason: str
    message: str
    unit: str = ""
    assumptions: tuple[str, ...] = ()  # the assumed values the verdict rests on, one line each
    tolerance_source: str = ""  # where a tolerance nobody chose came from ("gen's measured GPU default")


@dataclass(frozen=True)
class MachineEvidence:
    """The CPU used beside one phase's rounds (``pytest_rlbench.verdict.machine_load``), in the run and in the
    baseline's session, in cores on average; None where a session did not record it."""

    other_cores: float | None = None  # the run: cores used by processes outside the session
    steal_cores: float | None = None  # the run: cores taken by the hypervisor
    base_other_cores: float | None = None  # the baseline's session: cores used outside it

    @property
    def contended(self) -> bool:
        """Whether either session ran beside CPU contention: then its seconds measured the contention
        as much as the phase, and no pace read from the session's other phases may excuse them."""
        return any(c is not None and c >= CONTENTION_CORES for c in (self.other_cores, self.base_other_cores))

    def describe(self) -> str:
        """The figures in words: "other processes used 1.70 cores, the hypervisor took 0.05 cores"."""
        parts = []
        if self.other_cores is not None:
            parts.append(f"other processes used {self.other_cores:.2f} cores")
        if self.steal_cores:
            parts.append(f"the hypervisor took {self.steal_cores:.2f} cores")
        text = ", ".join(parts)
        if self.base_other_cores is not None and self.base_other_cores >= CONTENTION_CORES:
            beside = f"{self.base_other_cores:.2f} cores beside the baseline's own session"
            text = f"{text} (and {beside})" if text else f"other processes used {beside}"
        return text


def work_metric(kind: str, phase: str) -> str:
    """The run metric id of one count of a phase: work/<kind>/<phase> (kind: one of WORK_KINDS, or of
    ROUND_WORK: what its counted round did)."""
    return f"{WORK}/{kind}/{phase}"


@dataclass(frozen=True)
class WorkEvidence:
    """One phase's counted work in the run and in the baseline's session, by kind (WORK_KINDS)."""

    run: dict[str, float]
    base: dict[str, float]
    run_round: dict[str, float] = field(default_factory=dict)  # what the counted round did (ROUND_WORK)
    base_round: dict[str, float] = field(default_factory=dict)

    @property
    def comparable(self) -> bool:
        """Whether the two counted rounds did the same work (ROUND_WORK, where both recorded it): else
        their counts differ with the sampling and cannot tell a change in the code."""
        shared = [k for k in ROUND_WORK if k in self.run_round and k in self.base_round]
        return all(self.run_round[k] == self.base_round[k] for k in shared)

    def other_work(self) -> str:
        """ "its counted round did other work than the baseline's (response tokens 130,112 -> 131,072) ..." """
        moved = ", ".join(
            f"{words} {self.base_round[k]:,.0f} -> {self.run_round[k]:,.0f}" for k, (words, _) in ROUND_WORK.items()
            if k in self.run_round and k in self.base_round and self.run_round[k] != self.base_round[k]
        )
        return (
            f"its counted round did other work than the baseline's ({moved}), so its counts ({self.describe()}) "
            "cannot tell the code from the sampling"
        )

    def grew(self, kind: str) -> bool:
        """Whether the run dispatched more of ``kind`` than its baseline, past ``WORK_ALLOWANCE``."""
        ours, theirs = self.run.get(kind), self.base.get(kind)
        return ours is not None and theirs is not None and ours > theirs * (1 + WORK_ALLOWANCE)

    def _shared(self) -> list[str]:
        """The deciding kinds (DECIDING_KINDS) both sides counted."""
        return [kind for kind in DECIDING_KINDS if kind in self.run and kind in self.base]

    @property
    def more(self) -> bool:
        return self.comparable and any(self.grew(kind) for kind in self._shared())

    @property
    def identical(self) -> bool:
        shared = self._shared()
        return self.comparable and bool(shared) and all(self.run[kind] == self.base[kind] for kind in shared)

    @property
    def same(self) -> bool:
        """Every deciding count both sides have is within ``WORK_ALLOWANCE`` of the other (and there is one)."""
        shared = self._shared()
        return self.comparable and bool(shared) and all(
            abs(self.run[kind] - self.base[kind]) <= self.base[kind] * WORK_ALLOWANCE for kind in shared
        )

    def describe(self) -> str:
        """ "ops 2,310 -> 4,620, FLOPs 1.2e+09 -> 2.4e+09": the baseline's count, then the run's; on
        GPUs the device counts follow, those that changed first ("kernel launches 2,310 -> 4,620")."""
        parts, unchanged = [], []
        for kind in WORK_KINDS:
            if kind in self.run and kind in self.base:
                counts = (f"{v:,.0f}" if v < 1e9 else f"{v:.3g}" for v in (self.base[kind], self.run[kind]))
                label = "FLOPs" if kind == FLOPS else DEVICE_KINDS.get(kind, kind)
                if kind in DEVICE_KINDS and self.run[kind] == self.base[kind]:
                    unchanged.append(f"{label} {self.run[kind]:,.0f}")
                else:
                    parts.append(f"{label} {' -> '.join(counts)}")
        if unchanged:
            parts.append("unchanged: " + ", ".join(unchanged))
        return ", ".join(parts)


def with_work(
    verdict: Verdict, reason: str, why: str, work: WorkEvidence | None, slower_by: float | None = None,
    against: str = "",
) -> tuple[Verdict, str, str]:
    """A phase time's (verdict, reason, detail) read beside its counted work (the module docstring).
    ``slower_by``: how much slower the run's median was than the baseline's, where the gap was above the
    noise floor (``paced_slowdown``; None: not slower past the floor), measured as ``against`` says
    (" against the session's pace"; empty: in plain seconds)."""
    if work is None:
        return verdict, reason, why
    if not work.comparable:
        return verdict, reason, f"{why}; {work.other_work()}"
    counts = work.describe()
    excused = verdict == "inconclusive" and reason in SLOWER_YET_EXCUSED
    if (excused or reason == SLOWER_BESIDE_PEERS) and work.more:
        why += f"; but it dispatched more work than its baseline ({counts}): a change in the code, whatever the pace"
        return "fail", "more work", why
    if excused and work.same:
        same = "the same" if work.identical else f"within {WORK_ALLOWANCE:.0%} of the baseline's"
        return "pass", "same work", (
            f" (the time alone: {reason}{why}); the work was {same} ({counts}): the machine ran slower, not the "
            "code (the counters cannot see a slower kernel doing the same work)"
        )
    if verdict == "pass" and reason == NOT_SIGNIFICANT and work.more:  # past the tolerance and the floor
        return "fail", "more work", (
            f": {reason}{why}, but past the tolerance in seconds, and it dispatched more work ({counts}): "
            "a change in the code, which the counts make certain where the rounds alone could not"
        )
    if verdict == "pass" and work.more and slower_by is not None:  # slower_by is past the floor, so above 0
        return "fail", "more work", (
            f": {reason}{why}, but {slower_by:.1%} slower than the baseline{against}, past the noise floor, "
            f"and it dispatched more work ({counts}): a change in the code"
        )
    if verdict == "fail" or not work.same:
        return verdict, reason, f"{why}; {counts}"
    return verdict, reason, why


def paced_by(fig: Figure, pace: SessionPace | None) -> Figure:
    """A time figure with its value and rounds divided by the session's pace (as it is without one)."""
    if pace is None or fig.value is None:
        return fig
    f = pace.factor
    return replace(fig, value=fig.value / f, samples=tuple(t / f for t in fig.samples))


def paced_slowdown(
    run_fig: Figure, base_fig: Figure, pace: SessionPace | None, device: str
) -> float | None:
    """How much slower the run's median time was than the baseline's (0.10: 10%), divided by the
    session's pace where there is one; None where it was not slower by more than its phase's noise
    floor (or the figure is not a phase's time)."""
    if base_fig.family != TIMING or not base_fig.phase or not run_fig.value or not base_fig.value:
        return None
    paced = paced_by(run_fig, pace).value
    if paced - base_fig.value <= phase_floor(base_fig.phase, device):
        return None
    return paced / base_fig.value - 1


def tolerance_for(metric: str, baseline: RunRecord, default: float) -> float:
    """The baseline's tolerance for the metric id, else for its family, else ``default``."""
    return baseline.tolerances.get(metric, baseline.tolerances.get(family_of(metric), default))


def time_gap_s(run_time: float, ratio: float, higher_is_better: bool) -> float:
    """The seconds by which the run's phase was slower than the baseline's, from a figure's ratio: a
    lower-is-better figure grows with the time (baseline time = run time / ratio), a higher-is-better
    one shrinks with it (baseline time = run time x ratio)."""
    base_time = run_time * ratio if higher_is_better else run_time / ratio
    return run_time - base_time


def _seconds(value: float) -> str:
    return f"{value * 1000:.3g} ms" if value < 1 else f"{value:.3g} s"


def _worse(fig: Figure) -> str:
    if fig.higher_is_better:
        return "lower"
    return "slower" if fig.family == TIMING else "higher"


def gate_verdict(
    run_fig: Figure,
    base_fig: Figure,
    tolerance: float,
    run_time: float | None = None,
    device: str = "cpu",
    machine: MachineEvidence | None = None,
    pace: SessionPace | None = None,
    retimed: tuple[float, ...] | None = None,
    pace_again: SessionPace | None = None,
    gpu: GpuEvidence | None = None,
    work: WorkEvidence | None = None,
    side: SideBySide | None = None,
) -> tuple[Verdict, str, str]:
    """(verdict, reason, detail) for two present values by the rules of the module docstring.
    ``run_time``: the run's median seconds of the figure's phase (None: no floor applies); ``machine``:
    the CPU used beside the phase's rounds in both sessions (None: not recorded, no contention known);
    ``pace``: the session's pace around the phase (None: plain seconds decide); ``retimed``: the phase's
    rounds timed again at the end of the session (None: none were); ``pace_again``: the pace of its
    peers timed again beside them (None: plain seconds decide on the re-timed rounds); ``gpu``: the
    GPU telemetry of the phase's rounds in both sessions (None: not recorded); ``work``: the phase's
    counted work in both sessions (None: not counted), read last (``with_work``); ``side``: the phase
    timed side by side with its peers in both sessions (None: not), which then stands in for the pace
    and the re-timing (``against_side_by_side``)."""
    contended = machine is not None and machine.contended  # plain seconds decide under contention
    if side is not None and not contended and base_fig.family == TIMING:
        verdict, reason, why = against_side_by_side(run_fig, base_fig, tolerance, run_time, device, machine, side)
        if verdict == "fail" and gpu is not None and (seen := gpu.describe()):
            why += f"; {seen}"  # the GPUs' clocks, for the record (the peers in each pass ran at them too)
    else:
        verdict, reason, why = _time_verdict(
            run_fig, base_fig, tolerance, run_time, device, machine, pace, retimed, pace_again, gpu
        )
    if work is None or base_fig.family != TIMING:
        return verdict, reason, why
    if side is not None and not contended:
        run_side, base_side = side.figures(run_fig, base_fig)
        slower_by = paced_slowdown(run_side, base_side, None, device)
        return with_work(verdict, reason, why, work, slower_by, " at the host's speed of its side-by-side passes")
    paced = pace is not None and not contended
    slower_by = paced_slowdown(run_fig, base_fig, pace if paced else None, device)
    return with_work(verdict, reason, why, work, slower_by, " against the session's pace" if paced else "")


def against_side_by_side(
    run_fig: Figure, base_fig: Figure, tolerance: float, run_time: float | None, device: str,
    machine: MachineEvidence | None, side: SideBySide,
) -> tuple[Verdict, str, str]:
    """A phase's time judged beside its rounds timed side by side with its peers (``SideBySide``,
    each divided by the host's speed in its pass), by the tolerance, the floor and the rank test: a phase
    past the tolerance and the floor in seconds (whatever the rank test of its benchmark's few rounds
    says) that is slower there too is a regression; one slower in seconds only is "inconclusive" (reason
    "session slower"), unless past ``host_drift_limit``. As the pace, side by
    side only excuses: a phase within the tolerance in seconds passes (peers the code made faster would
    otherwise fail it)."""
    verdict, reason, why = plain_verdict(run_fig, base_fig, tolerance, run_time, device)
    plain_ratio = run_fig.value / base_fig.value if base_fig.value else 1.0
    run_side, base_side = side.figures(run_fig, base_fig)
    side_verdict, side_reason, side_why = plain_verdict(run_side, base_side, tolerance, run_side.value, device)
    beside = f"; beside the rounds {b}" if machine is not None and (b := machine.describe()) else ""
    if reason == "below the noise floor":
        return verdict, reason, why
    if reason == "within tolerance":
        if side_verdict != "fail":
            return verdict, reason, why
        if side.peers_same_work:
            return "fail", SLOWER_BESIDE_PEERS, (
                f": within the tolerance in seconds (ratio {plain_ratio:.2f}), but {side.describe()}{side_why}, and "
                "its peers did the same counted work as in the baseline, so the change did not make them faster: "
                f"this phase is slower, by what the counters cannot see (a wait, a slower kernel){beside}"
            )
        return "inconclusive", SLOWER_BESIDE_PEERS, (
            f": within the tolerance in seconds (ratio {plain_ratio:.2f}), but {side.describe()}{side_why}: this "
            "phase slower in a session that ran fast, or its peers made faster by the change, which side by side "
            "cannot tell apart (rerun, or save the baseline again)"
        )
    seconds = f"slower in seconds at ratio {plain_ratio:.2f} ({reason}{why})"
    if side_verdict == "fail":
        return "fail", side_reason, f": {seconds}, and {side.describe()}{side_why}{beside}"
    if verdict != "fail":  # the benchmark's rounds did not make it a failure either
        return verdict, reason, f"{why}; {side.describe()}"
    verdict, reason, why = excused_by_peers(
        base_fig, plain_ratio, device, f": {seconds}; {side.describe()} ({side_reason}{side_why})",
        f": {seconds}, but not beside its peers: {side.describe()} ({side_reason}{side_why}): the host ran "
        "slower, or a change slowed every phase alike, which one session cannot tell apart",
    )
    return verdict, reason, why + (beside if verdict == "fail" else "")


def excused_by_peers(
    base_fig: Figure, plain_ratio: float, device: str, evidence: str, excused: str
) -> tuple[Verdict, str, str]:
    """A phase slower in seconds but not against its peers (the session's pace, or side by side):
    "inconclusive" (reason "session slower", detail ``excused``), unless it is more than
    ``host_drift_limit`` times slower, which fails whatever its peers did (``evidence``: what they did)."""
    limit = host_drift_limit(device)
    if plain_ratio > limit:
        host = "a GPU's host" if device == "gpu" else "a CPU host"
        return "fail", _worse(base_fig), (
            f"{evidence}, but {plain_ratio:.2f}x is past the largest drift of a whole session measured on {host} "
            f"({limit:g}x)"
        )
    return "inconclusive", "session slower", excused


def _time_verdict(
    run_fig: Figure, base_fig: Figure, tolerance: float, run_time: float | None, device: str,
    machine: MachineEvidence | None, pace: SessionPace | None, retimed: tuple[float, ...] | None,
    pace_again: SessionPace | None, gpu: GpuEvidence | None,
) -> tuple[Verdict, str, str]:
    """``gate_verdict`` on the time alone."""
    verdict, reason, why = _judged_once(run_fig, base_fig, tolerance, run_time, device, machine, pace)
    if gpu is not None and base_fig.family == TIMING:
        return against_gpu(run_fig, base_fig, tolerance, gpu, verdict, reason, why)
    if verdict != "fail" or not retimed or base_fig.family != TIMING:
        return verdict, reason, why
    return reproduced(run_fig, base_fig, tolerance, device, machine, pace_again, retimed, reason, why)


def reproduced(
    run_fig: Figure, base_fig: Figure, tolerance: float, device: str, machine: MachineEvidence | None,
    pace: SessionPace | None, retimed: tuple[float, ...], reason: str, why: str,
) -> tuple[Verdict, str, str]:
    """A phase's time that failed, judged again on its rounds timed at the end of the session by the
    same rules, ``pace`` being that of its peers timed again beside them: a regression reproduces; a
    slowdown of a few seconds' rounds (the host's, on a shared VM) does not, and leaves the phase
    "inconclusive" (reason "not reproduced")."""
    median = statistics.median(retimed)
    again = replace(run_fig, value=median, samples=retimed)
    verdict, again_reason, again_why = _judged_once(again, base_fig, tolerance, median, device, machine, pace)
    ratio = median / base_fig.value
    if verdict == "fail":
        return "fail", reason, f"{why}; and again when re-timed at the end of the session, at ratio {ratio:.2f}{again_why}"
    return "inconclusive", "not reproduced", (
        f": slower in its benchmark{why}; but not when re-timed at the end of the session, at ratio {ratio:.2f} "
        f"({again_reason}{again_why}): a passing slowdown of the host, not a regression"
    )


def _judged_once(
    run_fig: Figure, base_fig: Figure, tolerance: float, run_time: float | None, device: str,
    machine: MachineEvidence | None, pace: SessionPace | None,
) -> tuple[Verdict, str, str]:
    """The verdict on one set of rounds: plain seconds, then contention or the session's pace."""
    verdict, reason, why = plain_verdict(run_fig, base_fig, tolerance, run_time, device)
    if base_fig.family != TIMING or not run_fig.samples or not base_fig.samples:
        return verdict, reason, why
    if machine is not None and machine.contended:
        if verdict == "fail" or reason == NOT_SIGNIFICANT:
            why += f"; {machine.describe()}: CPU contention"
        return verdict, reason, why
    if pace is not None and verdict == "fail":
        verdict, reason, why = against_pace(run_fig, base_fig, tolerance, run_time, device, pace, why)
    if machine is not None and verdict == "fail" and (beside := machine.describe()):
        why += f"; beside the rounds {beside}"
    return verdict, reason, why


def against_gpu(
    run_fig: Figure, base_fig: Figure, tolerance: float, gpu: GpuEvidence, verdict: Verdict, reason: str, why: str
) -> tuple[Verdict, str, str]:
    """A GPU phase's verdict read beside its telemetry: a failure the run's lower SM clock accounts for
    is "inconclusive" (reason "GPU clocks"); other processes on the GPU are named as contention; any
    other failure lists the clocks, for the record."""
    if verdict != "fail":
        return verdict, reason, why
    ratio = run_fig.value / base_fig.value
    seen = gpu.describe()
    if clocks_explain(ratio, tolerance, gpu):
        at_clock = ratio / (gpu.clock_ratio or 1)
        return "inconclusive", "GPU clocks", (
            f"{why}; {seen}: at the baseline's clock the phase would be at ratio {at_clock:.2f}, within the "
            "tolerance (the GPU ran slower, not the code)"
        )
    if gpu.other_processes:
        return verdict, reason, f"{why}; {seen}: GPU contention"
    return verdict, reason, f"{why}; {seen}" if seen else why


def against_pace(
    run_fig: Figure, base_fig: Figure, tolerance: float, run_time: float | None, device: str, pace: SessionPace,
    why: str,
) -> tuple[Verdict, str, str]:
    """The verdict on a phase's time that failed in plain seconds, judged again with its rounds divided
    by the session's pace: a fail there is a regression; a pass or inconclusive there leaves the phase
    "inconclusive" (reason "session slower"), unless it is slower than any host drift measured."""
    paced = paced_by(run_fig, pace)
    paced_time = run_time / pace.factor if run_time is not None else None
    verdict, reason, paced_why = plain_verdict(paced, base_fig, tolerance, paced_time, device)
    ratio = paced.value / base_fig.value
    if verdict == "fail":
        return "fail", reason, f"{why}; against the session's pace too, at ratio {ratio:.2f}{paced_why}: {pace.describe()}"
    return excused_by_peers(
        base_fig, run_fig.value / base_fig.value, device, f"{why}; {pace.describe()}",
        f": slower in seconds{why}, but {pace.describe()}, and against that pace the phase is at ratio {ratio:.2f} "
        f"({reason}): the host ran slower, or a change slowed every phase alike, which one session cannot tell "
        "apart (rerun, or save the baseline again)",
    )


def plain_verdict(
    run_fig: Figure, base_fig: Figure, tolerance: float, run_time: float | None = None, device: str = "cpu"
) -> tuple[Verdict, str, str]:
    """(verdict, reason, detail) of the figures' own values: tolerance, noise floor, rank test."""
    measured, base = run_fig.value, base_fig.value
    assert measured is not None and base is not None
    if base_fig.higher_is_better:
        beyond = measured < base * (1 - tolerance)
    else:
        beyond = measured > base * (1 + tolerance)
    if not beyond:
        return "pass", "within tolerance", ""
    if base_fig.family in FAMILIES and base_fig.phase and run_time is not None and measured and base:
        floor = phase_floor(base_fig.phase, device)
        gap = time_gap_s(run_time, measured / base, base_fig.higher_is_better)
        if gap <= floor:
            where = "GPU" if device == "gpu" else "CPU"
            why = f" (a difference of {_seconds(gap)} in time, at most the {_seconds(floor)} floor on {where})"
            return "pass", "below the noise floor", why
    value_floor_ = value_floor(base_fig.metric)
    if value_floor_ is not None and abs(measured - base) <= value_floor_:
        why = f" (a difference of {abs(measured - base):.3g}, at most the {value_floor_:g} floor of this figure)"
        return "pass", "below the noise floor", why
    n, m = max(len(run_fig.samples), 1), max(len(base_fig.samples), 1)
    worse = _worse(base_fig)
    if min(n, m) < 2:
        side = "the baseline" if m < 2 else "the run"
        return "fail", worse, f" (rests on one figure: {side} has a single value, so no rank test)"
    if smallest_p(n, m) >= ALPHA:
        need = rounds_needed(ALPHA)
        why = f" ({n} vs {m} rounds cannot reach p < {ALPHA:g}; {need} rounds per side can)"
        return "inconclusive", "too few rounds", why
    run_s, base_s = run_fig.samples, base_fig.samples
    p = p_greater(base_s, run_s) if base_fig.higher_is_better else p_greater(run_s, base_s)
    if p < ALPHA:
        return "fail", worse, f" (p = {p:.2g} < {ALPHA:g}, {n} vs {m} rounds)"
    return "pass", NOT_SIGNIFICANT, f" (p = {p:.2g} >= {ALPHA:g}, {n} vs {m} rounds)"


def judge(
    run_fig: Figure | None, base_fig: Figure, baseline_name: str, tolerance: float, mode: Mode = "gate", *,
    judged: bool = True, phase_ran: bool = True, run_time: float | None = None, device: str = "cpu",
    machine: MachineEvidence | None = None, pace: SessionPace | None = None,
    retimed: tuple[float, ...] | None = None, pace_again: SessionPace | None = None,
    gpu: GpuEvidence | None = None, work: WorkEvidence | None = None, side: SideBySide | None = None,
) -> Comparison:
    """Compare one figure of the run with the baseline's (see the module docstring for the rules).

    In a gate, ``judged`` False lists the row beside the one that carries its measurement's verdict
    (a phase's throughput beside its time); ``phase_ran`` False marks a figure of a phase this session
    did not run (``-k``) as "not run" rather than missing."""
    measured = run_fig.value if run_fig is not None else None
    base, unit = base_fig.value, base_fig.unit
    applied = float(tolerance)
    ratio = measured / base if measured is not None and base else None
    ratio_text = f"ratio {ratio:.2f}" if ratio is not None else "ratio n/a"
    numbers = f"{format_value(measured, unit)} vs {format_value(base, unit)} in baseline '{baseline_name}'"
    verdict: Verdict
    if measured is None and mode == "gate" and not phase_ran:
        verdict, reason = "not run", "not run"
        detail = f"not run in this session; baseline '{baseline_name}' has {format_value(base, unit)}"
    elif measured is None:
        verdict, reason = ("fail" if mode == "gate" else "reference"), "missing"
        why = f" ({run_fig.reason})" if run_fig is not None and run_fig.reason else ""
        detail = f"missing from this run{why}; baseline '{baseline_name}' has {format_value(base, unit)}"
    elif mode == "reference" or base is None or not judged:
        verdict, reason = "reference", "reference"
        role = "reference only" if mode == "reference" or base is None else "listed beside the phase's gated figure"
        detail = f"{numbers} ({ratio_text}): {role}"
    else:
        assert run_fig is not None
        verdict, reason, why = gate_verdict(
            run_fig, base_fig, applied, run_time, device, machine, pace, retimed, pace_again, gpu, work, side
        )
        detail = f"{numbers} ({ratio_text}, tolerance {applied:.2f}{_default_text(tolerance)}): {reason}{why}"
    message = f"{metric_label(base_fig.metric)}: {detail}"
    return Comparison(
        base_fig.metric, base_fig.phase, measured, base, baseline_name, ratio, applied, verdict, reason, message, unit,
        tolerance_source=getattr(tolerance, "source", ""),
    )


def _default_text(tolerance: float) -> str:
    """A tolerance nobody chose, named as the default in the verdict's text."""
    return f", {tolerance.source}" if isinstance(tolerance, DefaultTolerance) else ""
