"""A phase's rounds timed a second time at the end of a session on CPU workers, and which block of
rounds a verdict reads.

A benchmark times its phase's rounds back to back, a few seconds in all, so a few seconds in which a
shared host ran slow can slow every round of one phase and no other (seen on the 2-core CI VM: gen
at 1.34x its baseline while generate_sequences, the same work timed a minute earlier, ran at 1.21x
and every other phase at 0.95x). A regression in the code is slower whenever it is timed. So on CPU
workers the phase's gate test (``pytest_rlbench.session.gate_items``) times it again, the same call and
rounds, and keeps the rounds as the record's ``retimed_s/<phase>`` metric:
- in a session that saves a baseline, every phase: the baseline's bar is then its faster block of
  rounds (``faster_block``), so a slow block in the baseline's session cannot hide a later regression;
- in a session gated against a baseline, a phase whose time failed, and the phases that pace it
  (``pytest_rlbench.verdict.session_pace``): the failure stands only if the re-timed rounds fail too
  (``pytest_rlbench.verdict.judge.reproduced``), against the pace of the peers timed again beside them
  (``retimed_view``): the pace of the benchmarks, minutes earlier, says nothing of the host then.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from pytest_rlbench.records.metrics import RETIMED
from pytest_rlbench.records.record import PhaseRecord, RunRecord
from pytest_rlbench.verdict.derived import Figure


def retimed_metric(phase: str) -> str:
    return f"{RETIMED}/{phase}"


def retimed_rounds(record: RunRecord, phase: str) -> tuple[float, ...] | None:
    """The rounds of ``phase`` timed again at the end of the record's session, if they were."""
    metric = record.metrics.get(retimed_metric(phase))
    return tuple(metric.value) if metric is not None and metric.value else None


def retimed_is_faster(median_s: float, retimed: tuple[float, ...] | None) -> bool:
    """The one rule of the faster block: the re-timed rounds count where their median is lower."""
    return bool(retimed) and statistics.median(retimed) < median_s


def faster_block(fig: Figure, retimed: tuple[float, ...] | None) -> Figure:
    """A baseline's time figure as a verdict reads it: its re-timed rounds where their median is lower."""
    if fig.value is None or not retimed_is_faster(fig.value, retimed):
        return fig
    return replace(fig, value=statistics.median(retimed), samples=retimed)


def baseline_median(record: RunRecord, phase: str) -> float:
    """The median seconds of a baseline's phase, of its faster block of rounds (as ``faster_block``)."""
    median = statistics.median(record.phases[phase].seconds)
    retimed = retimed_rounds(record, phase)
    return statistics.median(retimed) if retimed_is_faster(median, retimed) else median


def retimed_view(record: RunRecord) -> RunRecord:
    """The record as its re-timed rounds alone tell it: only the phases timed again, with those rounds
    (what the session's pace at the re-timing is read from)."""
    phases = {p: PhaseRecord(seconds=list(r)) for p in record.phases if (r := retimed_rounds(record, p))}
    return replace(record, phases=phases)
