"""A CPU phase judged on rounds timed side by side with its peers: each pass's round over its peers'
in the same seconds, so a host whose speed moves from pass to pass leaves the verdict alone, and one
phase slower beside its peers fails, whatever the session's seconds say."""

from __future__ import annotations

import copy
import math
import statistics

import pytest
from test_session_pace import BASE, PHASES, ROUNDS  # the embedded default's shape, as a record

from pytest_rlbench.records.record import Metric, RunRecord, record_from_dict
from pytest_rlbench.verdict.compare import compare
from pytest_rlbench.verdict.retiming import (
    POOLED_SESSIONS,
    SIDE_BY_SIDE_PASSES,
    side_by_side_metric,
    side_by_side_rounds,
    with_earlier_sessions,
)
from pytest_rlbench.verdict.session_pace import relative_rounds, side_by_side

# The host's speed in each pass, as it moved on the 2-core VM (a pass's phases share it).
HOST = (1.0, 1.3, 0.8, 1.6, 1.1, 0.9, 1.45, 1.0, 0.75, 1.2, 1.05, 1.35)
JITTER = (1.0, 1.02, 0.98, 1.01, 0.99, 1.03, 0.97, 1.0, 1.02, 0.98, 1.01, 0.99)  # each round's own


def session(
    name: str, seconds: float = 1.0, beside: float = 1.0, slower: dict[str, float] | None = None,
    host: tuple[float, ...] = HOST, side: bool = True,
) -> RunRecord:
    """A session whose benchmarks ran ``seconds`` times the baseline's and its side-by-side passes
    ``beside`` times (each pass at the host's speed of ``host``), with each phase in ``slower`` that
    many times slower wherever it ran."""
    data = copy.deepcopy(BASE) | {"name": name}
    factor = {p: (slower or {}).get(p, 1.0) for p in PHASES}
    data["phases"] = {p: {"seconds": [t * seconds * factor[p] * r for r in ROUNDS]} for p, t in PHASES.items()}
    record = record_from_dict(data)
    if side:
        for p, t in PHASES.items():
            # a phase's jitter differs from its peers' in the same pass (shifted by the phase's place)
            shift = list(PHASES).index(p)
            rounds = [
                t * beside * factor[p] * h * JITTER[(i + shift) % len(JITTER)] for i, h in enumerate(host)
            ]
            record.metrics[side_by_side_metric(p)] = Metric(rounds, "s", False)
    return record


def row(run: RunRecord, base: RunRecord, phase: str, tolerance: float = 0.15):
    result = compare(run, base, tolerance)
    assert result.mode == "gate", result.mismatches
    return next(c for c in result.comparisons if c.metric == f"timing_s/{phase}")


def test_each_pass_is_read_against_its_peers_in_the_same_seconds() -> None:
    rounds = {"a": [1.0, 1.0, 0.5], "b": [2.0, 4.0, 1.0], "c": [0.5, 1.0, 0.25], "d": [3.0, 5.0, 1.5]}
    relative = relative_rounds(rounds, "a", ["b", "c"])  # b and c moved with the host, pass by pass
    assert relative == pytest.approx([1.0, 0.5, 1.0])  # pass 2: its peers took twice as long, a did not
    assert relative_rounds(rounds, "d", ["b", "c"])[1] == pytest.approx(5.0 / math.sqrt(4.0 * 1.0))
    run, base = session("run", host=tuple(reversed(HOST))), session("base")
    evidence = side_by_side(run, base, "old_log_prob")
    assert evidence is not None
    assert evidence.peers == ("generate_sequences", "gen", "ref", "update_actor")  # as the pace's peers
    assert evidence.ratio == pytest.approx(1.0, abs=0.03), evidence  # the host's moves cancel out


def test_one_phase_slower_beside_its_peers_fails_even_where_the_session_ran_faster() -> None:
    # the benchmarks ran in a fast stretch: old_log_prob 25% slower is only 1.06x in seconds
    run = session("run", seconds=0.85, slower={"old_log_prob": 1.25})
    judged = row(run, session("base"), "old_log_prob")
    assert (judged.verdict, judged.reason) == ("fail", "slower"), judged.message
    assert "its time relative to theirs was 1.25x the baseline's" in judged.message
    assert "in seconds at ratio 1.06" in judged.message
    peer = row(run, session("base"), "ref")
    assert peer.verdict == "pass", peer.message


def test_slower_in_seconds_alike_but_not_beside_its_peers_is_inconclusive() -> None:
    run = session("run", seconds=1.4, beside=1.3)
    judged = row(run, session("base"), "update_actor")
    assert (judged.verdict, judged.reason) == ("inconclusive", "session slower"), judged.message
    assert "not against its peers" in judged.message
    # the same phase rounds re-timed beside: nothing to reproduce, side by side stands for it
    assert "re-timed" not in judged.message
    # past any host drift measured, the seconds alone fail it
    far = row(session("run", seconds=1.9), session("base"), "update_actor")
    assert (far.verdict, far.reason) == ("fail", "slower"), far.message


def test_unchanged_code_on_a_host_that_moved_passes() -> None:
    run = session("run", seconds=1.1, host=HOST[6:] + HOST[:6])
    result = compare(run, session("base"), 0.15)
    timed = {c.phase: c.verdict for c in result.comparisons if c.metric.startswith("timing_s/")}
    assert set(timed.values()) <= {"pass"}, [c.message for c in result.comparisons if c.verdict != "pass"]


def test_a_baseline_without_side_by_side_rounds_is_read_on_the_session_s_pace() -> None:
    run, base = session("run", seconds=0.85, slower={"old_log_prob": 1.25}), session("base", side=False)
    assert side_by_side(run, base, "old_log_prob") is None
    judged = row(run, base, "old_log_prob")
    assert judged.verdict == "pass" and "side by side" not in judged.message  # within tolerance in seconds


def test_the_own_spread_of_the_baseline_s_blocks_does_not_widen_a_side_by_side_verdict() -> None:
    base = session("base")
    # the baseline's benchmark and two re-timed blocks of old_log_prob 40% apart
    base.metrics["retimed_s/old_log_prob"] = Metric([0.14 * r for r in ROUNDS] + [0.12 * r for r in ROUNDS], "s", False)
    judged = row(session("run", slower={"old_log_prob": 1.25}), base, "old_log_prob")
    assert judged.tolerance == pytest.approx(0.15) and judged.verdict == "fail", judged.message


def test_a_baseline_saved_again_pools_each_session_s_passes_as_passes() -> None:
    sessions = [session(f"s{i}", host=HOST[i:] + HOST[:i]) for i in range(POOLED_SESSIONS + 1)]
    pooled = sessions[0]
    for newer in sessions[1:]:
        pooled = with_earlier_sessions(newer, pooled)
    rounds = side_by_side_rounds(pooled)
    assert {len(v) for v in rounds.values()} == {POOLED_SESSIONS * SIDE_BY_SIDE_PASSES}
    newest = side_by_side_rounds(sessions[-1])
    assert all(rounds[p][:SIDE_BY_SIDE_PASSES] == newest[p] for p in rounds)  # the newest first
    # a session that timed other phases side by side is not pooled with them (its passes would not line up)
    other = session("other")
    del other.metrics[side_by_side_metric("ref")]
    assert side_by_side_rounds(with_earlier_sessions(other, pooled)) == side_by_side_rounds(other)
    assert statistics.median(rounds["ref"]) > 0
