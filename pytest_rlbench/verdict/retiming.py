"""A phase's rounds timed again at the end of a session on CPU workers, and which block of rounds a
verdict reads.

A benchmark times its phase's rounds back to back, a few seconds in all, so a few seconds in which a
shared host ran slow (or fast) can move every round of one phase and no other (seen on the 2-core CI
VM: gen at 1.34x its baseline while generate_sequences, the same work timed a minute earlier, ran at
1.21x and every other phase at 0.95x). A regression in the code is slower whenever it is timed. So on
CPU workers the phase's gate test (``pytest_rlbench.session.gate_items``) times it again, the same
call and rounds, and keeps the rounds as the record's ``retimed_s/<phase>`` metric, one block of
rounds after another (a block holds as many rounds as the phase's benchmark timed):
- in a session that saves a baseline, every phase, ``SAVED_RETIMED_BLOCKS`` times: the baseline's bar
  is then its median block of rounds (``bar_block``), of three, so that neither one slow block (which
  would hide a later regression) nor one fast block (which would fail unchanged code: on this VM a
  phase's blocks move 20-30% between sessions, docs/benchmarks.md) sets it. A baseline saved with one
  re-timed block has two: its bar is the faster (the lower middle). Saved again over a baseline of the
  same work on the same machine, it keeps the earlier sessions' blocks too (``with_earlier_sessions``),
  and the median block of them all is the bar: a session that ran a phase slow throughout no longer
  sets it;
- in a session gated against a baseline, a phase whose time failed, and the phases that pace it
  (``pytest_rlbench.verdict.session_pace``), once: the failure stands only if the re-timed rounds fail too
  (``pytest_rlbench.verdict.judge.reproduced``), against the pace of the peers timed again beside them
  (``retimed_view``): the pace of the benchmarks, minutes earlier, says nothing of the host then.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

from pytest_rlbench.records.metrics import RETIMED, SIDE_BY_SIDE
from pytest_rlbench.records.record import PhaseRecord, RunRecord
from pytest_rlbench.verdict.derived import Figure

# Blocks of rounds a session that saves a baseline times again per phase: with its benchmark's, three,
# whose median is the bar.
SAVED_RETIMED_BLOCKS = 2
SESSION_BLOCKS = SAVED_RETIMED_BLOCKS + 1
# A baseline saved again over a file of the same work on the same machine keeps the blocks of this many
# sessions, the newest first: one session's level can sit 15-50% off the machine's for a phase
# (docs/benchmarks.md, "The median block"), and the median block of several is nearer the machine's.
POOLED_SESSIONS = 3


# Passes of one round per gated phase that a session on CPU workers times side by side at its end: on
# the embedded default a pass takes about 2 s, and 12 put a phase's relative level within 4-6% across
# sessions (docs/benchmarks.md, "The CPU gate side by side"); judged in
# ``pytest_rlbench.verdict.session_pace.SideBySide``.
SIDE_BY_SIDE_PASSES = 12
# On GPUs, where the phases timed side by side wait on the host (tens of ms a round at the embedded
# default's tiny model, a pass about 2 s): between one H200's unchanged sessions the phases' levels lay
# 4-25% apart over their first 12 passes, 6-18% over all 24 (docs/benchmarks.md, "The GPU gate side by
# side").
GPU_SIDE_BY_SIDE_PASSES = 24


def side_by_side_passes(gpu: bool) -> int:
    """The side-by-side passes a session times at its end, on GPUs or on CPU workers."""
    return GPU_SIDE_BY_SIDE_PASSES if gpu else SIDE_BY_SIDE_PASSES


def side_by_side_metric(phase: str) -> str:
    return f"{SIDE_BY_SIDE}/{phase}"


def side_by_side_rounds(record: RunRecord) -> dict[str, tuple[float, ...]]:
    """Each phase's rounds timed side by side, one per pass, in the order timed (pooled sessions one
    after the other); none where the session did not."""
    prefix = f"{SIDE_BY_SIDE}/"
    return {m[len(prefix):]: tuple(v.value) for m, v in record.metrics.items() if m.startswith(prefix) and v.value}


def reads_side_by_side(baseline: RunRecord, gpu: bool) -> bool:
    """Whether a baseline can judge a session's phases side by side (``gpu``: the session's on GPUs):
    one saved on CPU workers for a CPU session; for a GPU session a GPU baseline that timed its phases so
    (a small model's, ``pytest_rlbench.session.bench.side_by_side_rule``). Another device's baseline is
    only a reference."""
    if baseline.hardware.device != ("gpu" if gpu else "cpu"):
        return False
    return not gpu or bool(side_by_side_rounds(baseline))


def retimed_metric(phase: str) -> str:
    return f"{RETIMED}/{phase}"


def blocks_of(rounds: Sequence[float], size: int | None) -> list[tuple[float, ...]]:
    """Re-timed ``rounds`` split into blocks of ``size`` (the phase's own rounds), in the order timed;
    rounds that do not split so (or no size) are one block, and no rounds no block."""
    values = tuple(rounds)
    if not values:
        return []
    if not size or len(values) % size:
        return [values]
    return [values[i : i + size] for i in range(0, len(values), size)]


def retimed_blocks(record: RunRecord, phase: str) -> list[tuple[float, ...]]:
    """The blocks of rounds of ``phase`` timed again at the end of the record's session (``blocks_of``;
    none: it was not)."""
    metric = record.metrics.get(retimed_metric(phase))
    own = record.phases.get(phase)
    return blocks_of(metric.value if metric is not None else (), len(own.seconds) if own is not None else None)


def retimed_rounds(record: RunRecord, phase: str) -> tuple[float, ...] | None:
    """The first block of rounds of ``phase`` timed again at the end of the record's session, if it was:
    what a gated session's failure must reproduce in."""
    blocks = retimed_blocks(record, phase)
    return blocks[0] if blocks else None


def median_block(blocks: list[tuple[float, ...]]) -> tuple[float, ...]:
    """The block whose median is the median of the blocks' (of an even count, the lower middle)."""
    ranked = sorted(blocks, key=statistics.median)
    return ranked[(len(ranked) - 1) // 2]


def bar_block(fig: Figure, blocks: list[tuple[float, ...]]) -> Figure:
    """A baseline's time figure as a verdict reads it: its median block of rounds, of its benchmark's
    and those timed again (with none timed again, the benchmark's)."""
    if fig.value is None or not blocks or not fig.samples:
        return fig
    bar = median_block([tuple(fig.samples), *blocks])
    return replace(fig, value=statistics.median(bar), samples=bar)


def block_medians(record: RunRecord, phase: str) -> list[float]:
    """The median seconds of each block of rounds the record's own session timed ``phase`` in: its
    benchmark's, then those timed again, not an earlier session's (``with_earlier_sessions``):
    ``pytest_rlbench.verdict.noise.spread_tolerance`` reads their spread, the noise within a session."""
    own = record.phases.get(phase)
    if own is None or not own.seconds:
        return []
    blocks = (tuple(own.seconds), *retimed_blocks(record, phase))[:SESSION_BLOCKS]
    return [statistics.median(b) for b in blocks]


def baseline_median(record: RunRecord, phase: str) -> float:
    """The median seconds of a baseline's phase, of its median block of rounds (as ``bar_block``)."""
    own = tuple(record.phases[phase].seconds)
    return statistics.median(median_block([own, *retimed_blocks(record, phase)]))


def with_earlier_sessions(run: RunRecord, earlier: RunRecord) -> RunRecord:
    """``run`` as a baseline that also keeps ``earlier``'s blocks of rounds (a baseline of the same work
    saved before on this machine), after its own, up to ``POOLED_SESSIONS`` sessions' blocks per phase.
    A phase either record timed in another number of rounds keeps ``run``'s blocks alone; where none
    kept more, ``run`` itself is returned."""
    metrics = dict(run.metrics)
    for phase, own in run.phases.items():
        before = earlier.phases.get(phase)
        if before is None or not own.seconds or len(before.seconds) != len(own.seconds):
            continue
        theirs = [tuple(before.seconds), *retimed_blocks(earlier, phase)]
        if any(len(block) != len(own.seconds) for block in theirs):
            continue
        blocks = [*retimed_blocks(run, phase), *theirs][: POOLED_SESSIONS * SESSION_BLOCKS - 1]
        metric = metrics.get(retimed_metric(phase))
        if metric is not None:
            metrics[retimed_metric(phase)] = replace(metric, value=[t for block in blocks for t in block])
    metrics.update(_pooled_side_by_side(run, earlier))
    return replace(run, metrics=metrics) if metrics != run.metrics else run


def _pooled_side_by_side(run: RunRecord, earlier: RunRecord) -> dict:
    """``run``'s side-by-side rounds with ``earlier``'s after them, up to ``POOLED_SESSIONS`` sessions'
    passes, where both timed the same phases in as many passes each (a pass stays one pass across its
    phases); else nothing."""
    ours, theirs = side_by_side_rounds(run), side_by_side_rounds(earlier)
    if not ours or set(ours) != set(theirs) or len({len(v) for v in ours.values()}) != 1:
        return {}
    if len({len(v) for v in theirs.values()}) != 1:
        return {}
    cap = POOLED_SESSIONS * SIDE_BY_SIDE_PASSES
    return {
        side_by_side_metric(p): replace(run.metrics[side_by_side_metric(p)], value=[*ours[p], *theirs[p]][:cap])
        for p in ours
    }


def pooled_sessions(record: RunRecord, phase: str) -> int:
    """How many sessions' blocks of rounds a baseline keeps for ``phase`` (of ``SESSION_BLOCKS`` each)."""
    return -(-(1 + len(retimed_blocks(record, phase))) // SESSION_BLOCKS)


def retimed_view(record: RunRecord) -> RunRecord:
    """The record as its first re-timed rounds alone tell it: only the phases timed again, with those
    rounds (what the session's pace at the re-timing is read from)."""
    phases = {p: PhaseRecord(seconds=list(r)) for p in record.phases if (r := retimed_rounds(record, p))}
    return replace(record, phases=phases)
