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
pass, at its end (``side_by_side_s/<phase>``, ``pytest_rlbench.session.gate_items``). In each pass a
phase's round is divided by the geometric mean of its peers' rounds of the same pass: what is left is
its cost relative to its peers, with the host's speed of those seconds taken out. A verdict compares
the run's relative rounds with the baseline's, both brought to seconds at the baseline's peer level.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
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


def relative_rounds(rounds: dict[str, Sequence[float]], phase: str, peers: Sequence[str]) -> tuple[float, ...]:
    """Each pass's round of ``phase`` over the geometric mean of its ``peers``' rounds in that pass."""
    own = rounds[phase]
    return tuple(
        t / math.exp(statistics.fmean(math.log(rounds[q][i]) for q in peers)) for i, t in enumerate(own)
    )


def peer_level(rounds: dict[str, Sequence[float]], peers: Sequence[str]) -> float:
    """The median over the passes of the peers' geometric mean: seconds to bring relative rounds to."""
    n = len(rounds[peers[0]])
    return statistics.median(math.exp(statistics.fmean(math.log(rounds[q][i]) for q in peers)) for i in range(n))


@dataclass(frozen=True)
class SideBySide:
    """A phase's rounds timed side by side with its peers', in the run and in the baseline, each over the
    geometric mean of its peers' rounds in the same pass (``relative_rounds``)."""

    phase: str
    peers: tuple[str, ...]
    run: tuple[float, ...]  # the run's relative rounds, one per pass
    base: tuple[float, ...]  # the baseline's (of every session it pools)
    level: float  # the baseline's peer level in seconds (``peer_level``)

    @property
    def ratio(self) -> float:
        return statistics.median(self.run) / statistics.median(self.base)

    def figures(self, run_fig: Figure, base_fig: Figure) -> tuple[Figure, Figure]:
        """The two time figures as side by side tells them: relative rounds in seconds at the baseline's
        peer level, so that the tolerance, the noise floor and the rank test read them as times."""
        run = tuple(r * self.level for r in self.run)
        base = tuple(b * self.level for b in self.base)
        return (
            replace(run_fig, value=statistics.median(run), samples=run),
            replace(base_fig, value=statistics.median(base), samples=base),
        )

    def describe(self) -> str:
        return (
            f"timed side by side with {', '.join(self.peers)} at the end of the session ({len(self.run)} vs "
            f"{len(self.base)} passes), its time relative to theirs was {self.ratio:.2f}x the baseline's"
        )


def side_by_side(run: RunRecord, baseline: RunRecord, phase: str) -> SideBySide | None:
    """``phase``'s side-by-side evidence where both sessions timed it and at least ``MIN_PEERS`` of its
    peers so (peers as ``pace_peers``, of the phases both timed in as many passes), else None."""
    ours, theirs = side_by_side_rounds(run), side_by_side_rounds(baseline)
    if phase not in ours or phase not in theirs:
        return None
    candidates = [
        p for p in ours
        if p in theirs and p in baseline.phases and baseline.phases[p].seconds
        and len(ours[p]) == len(ours[phase]) and len(theirs[p]) == len(theirs[phase])
        and baseline_median(baseline, p) >= PACE_MIN_S
    ]
    peers = [p for p in pace_peers(phase, [*candidates, phase]) if p != phase]
    if len(peers) < MIN_PEERS:
        return None
    return SideBySide(
        phase, tuple(peers), relative_rounds(ours, phase, peers), relative_rounds(theirs, phase, peers),
        peer_level(theirs, peers),
    )

