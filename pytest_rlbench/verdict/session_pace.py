"""How fast a whole session ran against its baseline's session, read from the session's own phases.

On a small cloud VM a whole session can run 1.2-1.65x slower than the one before, every phase
together, with nothing else running (docs/benchmarks.md, "The gate's error rates"); a regression
in the code under test moves the phases it touches. So beside each phase's plain ratio to its
baseline (median seconds over median seconds) a verdict on CPU workers reads the session's pace:
the median of the ratios of the session's other phases, its "peers". A phase that is slower than
its baseline both in seconds and against its peers is a regression; one slower in seconds only is
"inconclusive" (``pytest_rlbench.verdict.judge``): every phase slowed alike, which one session cannot tell
from a slower host.

Peers are the phases both records timed, whose baseline median is at least ``PACE_MIN_S`` (shorter
ones carry noise of their own), other than the phase itself and those nested with it (gen holds
generate_sequences and reshard: their times share work, so a regression in one moves the other). A
phase with fewer than ``MIN_PEERS`` candidates apart from it that holds others (step, beside which
only save_checkpoint runs) is paced by the phases inside it. With fewer than
``MIN_PEERS`` peers a phase has no pace, and plain seconds decide.

Side by side (``SideBySide``): the pace above is read from each phase's own benchmark, timed minutes
apart, and on a shared VM the host's speed moves by tens of percent over seconds, so a phase's level
belongs to its stretch of time more than to the session (docs/benchmarks.md, "The CPU gate side by
side"). So a session on CPU workers also times one round of every gated phase in turn, pass after
pass, at its end (``side_by_side_s/<phase>``, ``pytest_rlbench.session.gate_items``). The host's speed
in a pass is read from the phase's peers in that pass: each group of peers (nested phases, the same
work, are one group) against its own level in the baseline, and the median of the groups, so that
one peer made faster or slower by the code does not move it. A phase's round divided by that speed is
its time as at the baseline's usual speed, and the verdict compares those of the run and the baseline.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from pytest_rlbench.records.record import RunRecord
from pytest_rlbench.verdict.derived import Figure
from pytest_rlbench.verdict.retiming import baseline_median, side_by_side_rounds
from trainer.phases import nested, phases_within

# Phases that pace a session must take at least this long in the baseline: 5x the CPU noise floor
# (pytest_rlbench.records.metrics); the embedded default's reshard (1 ms), reward (3 ms), adv (0.1 ms) and
# save_checkpoint (30 ms) are left out, its generation, log-prob, update and step phases (0.1-0.8 s) kept.
PACE_MIN_S = 0.05
MIN_PEERS = 2
# On GPUs the phases timed side by side are those that wait on the host (pytest_rlbench.session.bench.
# side_by_side_rule), tens of ms a round at the embedded default's tiny model: its old_log_prob and ref
# (30-60 ms) witness the host's speed too; reshard, reward and adv (under 10 ms) do not.
GPU_PACE_MIN_S = 0.02


def pace_min_s(device: str) -> float:
    """The shortest baseline median of a phase that paces others side by side on ``device``."""
    return GPU_PACE_MIN_S if device == "gpu" else PACE_MIN_S


@dataclass(frozen=True)
class SessionPace:
    """The pace of the session around one phase: its peers' ratios to the baseline and their median."""

    phase: str
    peers: tuple[tuple[str, float], ...]  # (phase, run median / baseline median), in record order

    @property
    def factor(self) -> float:
        return statistics.median(ratio for _, ratio in self.peers)

    def describe(self) -> str:
        ratios = ", ".join(f"{phase} {ratio:.2f}" for phase, ratio in self.peers)
        return f"the session's other phases ran at {self.factor:.2f}x their baseline's (median of {ratios})"


def phase_ratios(run: RunRecord, baseline: RunRecord) -> dict[str, float]:
    """Each phase both records timed: the run's median seconds over the baseline's (of the baseline's
    median block of rounds, ``pytest_rlbench.verdict.retiming``)."""
    out = {}
    for phase, theirs in baseline.phases.items():
        ours = run.phases.get(phase)
        if ours is None or not ours.seconds or not theirs.seconds:
            continue
        base = baseline_median(baseline, phase)
        if base > 0:
            out[phase] = statistics.median(ours.seconds) / base
    return out


def pace_peers(phase: str, candidates: list[str]) -> list[str]:
    """The candidates that pace ``phase``: those apart from it, or, for a phase that holds nearly all
    of them (step, beside which only save_checkpoint may run), those inside it."""
    others = [p for p in candidates if p != phase]
    apart = [p for p in others if not nested(phase, p)]
    return apart if len(apart) >= MIN_PEERS else [p for p in others if p in phases_within(phase)]


def session_paces(run: RunRecord, baseline: RunRecord) -> dict[str, SessionPace]:
    """The pace around each phase both records timed that has at least ``MIN_PEERS`` peers."""
    ratios = phase_ratios(run, baseline)
    candidates = [p for p in ratios if baseline_median(baseline, p) >= PACE_MIN_S]
    paces = {}
    for phase in ratios:
        peers = pace_peers(phase, candidates)
        if len(peers) >= MIN_PEERS:
            paces[phase] = SessionPace(phase, tuple((p, ratios[p]) for p in peers))
    return paces


# Peer groups a phase needs to be judged side by side: with three, the host's speed of a pass is their
# median, which one group that changed (a phase made faster) cannot move; with two it would sit halfway.
MIN_SIDE_BY_SIDE_GROUPS = 3


def peer_groups(peers: Sequence[str]) -> list[tuple[str, ...]]:
    """``peers`` in groups of phases nested in one another (gen and generate_sequences: the same work
    timed twice), each group one witness of the host's speed, in the peers' order."""
    groups: list[list[str]] = []
    for peer in peers:
        home = next((g for g in groups if any(nested(peer, q) for q in g)), None)
        if home is None:
            groups.append([peer])
        else:
            home.append(peer)
    return [tuple(g) for g in groups]


def group_rounds(rounds: Mapping[str, Sequence[float]], group: Sequence[str]) -> list[float]:
    """A group's round in each pass: the geometric mean of its phases' rounds (0 where one took none)."""
    n = len(rounds[group[0]])
    return [
        math.exp(statistics.fmean(math.log(rounds[q][i]) for q in group)) if all(rounds[q][i] > 0 for q in group) else 0.0
        for i in range(n)
    ]


def host_speeds(rounds: Mapping[str, Sequence[float]], groups: Sequence[Sequence[str]], levels: Sequence[float]) -> list[float]:
    """The host's speed in each pass, as a factor of the baseline's: the median over the peer groups of
    each group's round over its baseline level (``levels``); 0 where a group took no time."""
    per_group = [group_rounds(rounds, g) for g in groups]
    n = len(per_group[0])
    return [
        statistics.median(r[i] / level for r, level in zip(per_group, levels, strict=True))
        if all(r[i] > 0 for r in per_group)
        else 0.0
        for i in range(n)
    ]


def paced_rounds(own: Sequence[float], speeds: Sequence[float]) -> tuple[float, ...]:
    """A phase's rounds with each pass's host speed taken out (passes whose speed is unknown left out)."""
    return tuple(t / h for t, h in zip(own, speeds, strict=True) if h > 0)


@dataclass(frozen=True)
class SideBySide:
    """A phase's rounds timed side by side with its peers' in the run and in the baseline, each divided
    by the host's speed in its pass (``host_speeds``): seconds as at the baseline's usual speed."""

    phase: str
    groups: tuple[tuple[str, ...], ...]  # its peers, nested ones grouped
    run: tuple[float, ...]  # the run's paced rounds, one per pass
    base: tuple[float, ...]  # the baseline's (of every session it pools)
    peers_same_work: bool = False  # every peer counted the same work as in the baseline (judge.WorkEvidence)

    @property
    def ratio(self) -> float:
        return statistics.median(self.run) / statistics.median(self.base)

    def figures(self, run_fig: Figure, base_fig: Figure) -> tuple[Figure, Figure]:
        """The two time figures as side by side tells them, for the tolerance, the floor and the rank test."""
        return (
            replace(run_fig, value=statistics.median(self.run), samples=self.run),
            replace(base_fig, value=statistics.median(self.base), samples=self.base),
        )

    def describe(self) -> str:
        peers = ", ".join("/".join(g) for g in self.groups)
        return (
            f"timed side by side with {peers} at the end of the session ({len(self.run)} vs {len(self.base)} "
            f"passes), at the host's speed of each pass it was at ratio {self.ratio:.2f}"
        )


def side_by_side(run: RunRecord, baseline: RunRecord, phase: str) -> SideBySide | None:
    """``phase``'s side-by-side evidence where both sessions timed it and at least
    ``MIN_SIDE_BY_SIDE_GROUPS`` groups of its peers so (peers as ``pace_peers``, of the phases both timed
    in as many passes), else None."""
    ours, theirs = side_by_side_rounds(run), side_by_side_rounds(baseline)
    if phase not in ours or phase not in theirs:
        return None
    candidates = [
        p for p in ours
        if p in theirs and p in baseline.phases and baseline.phases[p].seconds
        and len(ours[p]) == len(ours[phase]) and len(theirs[p]) == len(theirs[phase])
        and baseline_median(baseline, p) >= pace_min_s(run.hardware.device)
    ]
    groups = peer_groups([p for p in pace_peers(phase, [*candidates, phase]) if p != phase])
    if len(groups) < MIN_SIDE_BY_SIDE_GROUPS:
        return None
    levels = [statistics.median(group_rounds(theirs, g)) for g in groups]
    if not all(level > 0 for level in levels):
        return None
    run_rounds = paced_rounds(ours[phase], host_speeds(ours, groups, levels))
    base_rounds = paced_rounds(theirs[phase], host_speeds(theirs, groups, levels))
    if not run_rounds or not base_rounds or statistics.median(base_rounds) <= 0:
        return None
    return SideBySide(phase, tuple(groups), run_rounds, base_rounds)
