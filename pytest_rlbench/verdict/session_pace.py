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
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from pytest_rlbench.records.record import RunRecord
from pytest_rlbench.verdict.retiming import baseline_median
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
