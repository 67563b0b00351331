"""A phase judged against the session's pace on CPU workers: a whole session that slowed alike is
inconclusive, one phase slower than its peers fails, and plain seconds decide where no pace can be read."""

from __future__ import annotations

import copy
import statistics
from typing import Any

import pytest

from pytest_rlbench.records.record import RunRecord, record_from_dict
from pytest_rlbench.verdict.compare import compare
from pytest_rlbench.verdict.judge import HOST_DRIFT_LIMIT
from pytest_rlbench.verdict.session_pace import PACE_MIN_S, pace_peers, session_paces

# A CPU session of the embedded default's shape: five rounds of each phase, in seconds.
PHASES = {
    "reshard": 0.001, "generate_sequences": 0.29, "gen": 0.30, "reward": 0.003, "old_log_prob": 0.10,
    "ref": 0.10, "adv": 0.0001, "update_actor": 0.27, "step": 0.80, "save_checkpoint": 0.03,
}
ROUNDS = (0.98, 0.99, 1.0, 1.01, 1.02)  # each phase's rounds around its median
BASE: dict[str, Any] = {
    "format_version": 1,
    "name": "base",
    "provenance": {"source": "pytest-rlbench run"},
    "hardware": {"device": "cpu", "nodes": 1, "world_size": 2, "gpus_per_node": 0, "cpu_model": "AMD EPYC",
                 "cpus_per_node": 2},
    "model": {"name": "tiny", "num_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 4,
              "num_kv_heads": 2, "head_dim": 16, "vocab_size": 100},
    "config": {"train_batch_size": 16, "rollout_n": 4, "max_prompt_length": 256, "max_response_length": 64},
}


def session(name: str, scale: dict[str, float] | None = None, everything: float = 1.0, **changes: Any) -> RunRecord:
    """A session whose every phase ran ``everything`` times the baseline's, and each phase in ``scale``
    that many times more."""
    data = copy.deepcopy(BASE) | {"name": name}
    factors = {p: everything * (scale or {}).get(p, 1.0) for p in PHASES}
    data["phases"] = {p: {"seconds": [t * factors[p] * r for r in ROUNDS]} for p, t in PHASES.items()}
    for section, value in changes.items():
        data[section] = {**data[section], **value}
    return record_from_dict(data)


def verdicts(run: RunRecord) -> dict[str, tuple[str, str]]:
    result = compare(run, session("base"), 0.20)
    assert result.mode == "gate", result.mismatches
    return {c.phase: (c.verdict, c.reason) for c in result.comparisons if c.metric.startswith("timing_s/")}


def test_peers_leave_out_the_phase_and_those_nested_with_it() -> None:
    candidates = ["generate_sequences", "gen", "old_log_prob", "ref", "update_actor", "step"]
    assert pace_peers("gen", candidates) == ["old_log_prob", "ref", "update_actor"]
    assert pace_peers("generate_sequences", candidates) == ["old_log_prob", "ref", "update_actor"]
    assert pace_peers("ref", candidates) == ["generate_sequences", "gen", "old_log_prob", "update_actor"]
    # step holds every other phase: the phases inside it pace it
    assert pace_peers("step", candidates) == ["generate_sequences", "gen", "old_log_prob", "ref", "update_actor"]
    # and still when a save_checkpoint long enough to pace runs beside it: one peer apart is no pace
    with_save = [*candidates, "save_checkpoint"]
    assert pace_peers("step", with_save) == ["generate_sequences", "gen", "old_log_prob", "ref", "update_actor"]
    assert "save_checkpoint" in pace_peers("ref", with_save)
    # phases shorter than PACE_MIN_S in the baseline pace nothing, but are paced themselves
    paces = session_paces(session("run", everything=1.3), session("base"))
    assert PHASES["reshard"] < PACE_MIN_S and "reshard" in paces
    assert all(p not in dict(pace.peers) for pace in paces.values() for p in ("reshard", "adv", "save_checkpoint"))
    assert paces["ref"].factor == pytest.approx(1.3)


def test_a_whole_session_slower_alike_is_inconclusive_not_a_regression() -> None:
    judged = verdicts(session("run", everything=1.35))
    long_phases = ("generate_sequences", "gen", "old_log_prob", "ref", "update_actor", "step")
    assert {judged[p] for p in long_phases} == {("inconclusive", "session slower")}
    result = compare(session("run", everything=1.35), session("base"), 0.20)
    assert result.passed  # inconclusive does not fail the session
    ref = next(c for c in result.comparisons if c.metric == "timing_s/ref")
    assert "the session's other phases ran at 1.35x their baseline's" in ref.message
    assert "one session cannot tell" in ref.message


def test_one_phase_slower_than_its_peers_fails_even_in_a_slower_session() -> None:
    assert verdicts(session("run", {"old_log_prob": 1.25}))["old_log_prob"] == ("fail", "slower")
    judged = verdicts(session("run", {"old_log_prob": 1.3}, everything=1.3))
    assert judged["old_log_prob"] == ("fail", "slower")
    assert judged["ref"] == ("inconclusive", "session slower")
    result = compare(session("run", {"old_log_prob": 1.3}, everything=1.3), session("base"), 0.20)
    message = next(c.message for c in result.failures)
    assert "against the session's pace too, at ratio 1.30" in message


def test_a_session_slower_than_any_host_drift_measured_fails() -> None:
    judged = verdicts(session("run", everything=HOST_DRIFT_LIMIT + 0.1))
    assert judged["update_actor"] == ("fail", "slower")


def test_plain_seconds_decide_on_gpus_and_without_enough_peers() -> None:
    gpu = {"device": "gpu", "gpus_per_node": 2, "gpu_model": "NVIDIA H100 80GB HBM3", "cpu_model": None}
    run, base = session("run", everything=1.35, hardware=gpu), session("base", hardware=gpu)
    result = compare(run, base, 0.20)
    assert {c.verdict for c in result.comparisons if c.metric == "timing_s/ref"} == {"fail"}
    # one long phase alone (a -k subset): nothing to read the session's pace from
    alone = session("run", everything=1.35)
    alone.phases = {p: s for p, s in alone.phases.items() if p in ("ref", "adv")}
    judged = {c.phase: c.verdict for c in compare(alone, session("base"), 0.20).comparisons
              if c.metric.startswith("timing_s/") and c.verdict != "not run"}
    assert judged["ref"] == "fail"


def test_a_failure_that_does_not_reproduce_when_re_timed_is_inconclusive() -> None:
    from pytest_rlbench.records.record import Metric

    run = session("run", {"old_log_prob": 1.3})
    base = session("base")
    assert verdicts(run)["old_log_prob"] == ("fail", "slower")
    # its rounds timed again at the end of the session ran as the baseline's: a passing slowdown
    run.metrics["retimed_s/old_log_prob"] = Metric([0.1 * r for r in ROUNDS], "s", False)
    result = compare(run, base, 0.20)
    row = next(c for c in result.comparisons if c.metric == "timing_s/old_log_prob")
    assert (row.verdict, row.reason) == ("inconclusive", "not reproduced") and result.passed
    assert "retimed_s/old_log_prob" not in {c.metric for c in result.comparisons}  # evidence, never judged
    # slower again when re-timed (against the session's pace too): the regression stands
    run.metrics["retimed_s/old_log_prob"] = Metric([0.13 * r for r in ROUNDS], "s", False)
    row = next(c for c in compare(run, base, 0.20).comparisons if c.metric == "timing_s/old_log_prob")
    assert (row.verdict, row.reason) == ("fail", "slower")
    assert "and again when re-timed at the end of the session, at ratio 1.30" in row.message


def test_a_baseline_s_slow_block_of_rounds_does_not_set_the_bar() -> None:
    from pytest_rlbench.records.record import Metric

    # the baseline's session ran old_log_prob's benchmark block 1.3x slow, and its re-timed rounds at speed
    base = session("base", {"old_log_prob": 1.3})
    run = session("run", {"old_log_prob": 1.25})  # a regression of 25%
    row = next(c for c in compare(run, base, 0.20).comparisons if c.metric == "timing_s/old_log_prob")
    assert row.verdict == "pass"  # hidden behind the slow block
    base.metrics["retimed_s/old_log_prob"] = Metric([0.1 * r for r in ROUNDS], "s", False)
    row = next(c for c in compare(run, base, 0.20).comparisons if c.metric == "timing_s/old_log_prob")
    assert (row.verdict, row.baseline) == ("fail", pytest.approx(0.1))
    # the baseline's faster block paces the session too
    assert session_paces(run, base)["ref"].peers[2] == ("old_log_prob", pytest.approx(1.25))


def test_a_baseline_s_bar_is_its_median_block_of_three() -> None:
    from pytest_rlbench.records.record import Metric
    from pytest_rlbench.verdict.retiming import baseline_median, retimed_blocks

    def blocks(record: RunRecord, phase: str, *factors: float) -> None:
        record.metrics[f"retimed_s/{phase}"] = Metric(
            [PHASES[phase] * f * r for f in factors for r in ROUNDS], "s", False
        )

    # the baseline's update_actor: its benchmark block at speed, then one block 1.3x fast (0.77) and one at speed
    base = session("base")
    blocks(base, "update_actor", 0.77, 1.02)
    assert [round(statistics.median(b), 4) for b in retimed_blocks(base, "update_actor")] == [0.2079, 0.2754]
    assert baseline_median(base, "update_actor") == pytest.approx(0.27)  # the benchmark's block, the middle
    # unchanged code 10% slower in both blocks passes at 0.20; against the fast block alone it failed
    run = session("run", {"update_actor": 1.1})
    blocks(run, "update_actor", 1.1)
    row = next(c for c in compare(run, base, 0.20).comparisons if c.metric == "timing_s/update_actor")
    assert (row.verdict, row.baseline) == ("pass", pytest.approx(0.27)), row.message
    base.metrics["retimed_s/update_actor"] = Metric([PHASES["update_actor"] * 0.77 * r for r in ROUNDS], "s", False)
    row = next(c for c in compare(run, base, 0.20).comparisons if c.metric == "timing_s/update_actor")
    assert row.verdict == "fail" and row.baseline == pytest.approx(0.2079), row.message  # two blocks: the faster
    # one slow block of three does not set the bar either (a 25% regression is not hidden behind it)
    slow = session("base", {"old_log_prob": 1.3})
    blocks(slow, "old_log_prob", 1.0, 1.01)
    run = session("run", {"old_log_prob": 1.25})
    blocks(run, "old_log_prob", 1.25)
    row = next(c for c in compare(run, slow, 0.20).comparisons if c.metric == "timing_s/old_log_prob")
    assert row.verdict == "fail" and row.baseline == pytest.approx(0.101), row.message


def test_a_phase_whose_baseline_blocks_spread_wider_than_the_default_is_judged_at_its_spread() -> None:
    from pytest_rlbench.records.record import Metric
    from pytest_rlbench.verdict.compare import Comparison
    from pytest_rlbench.verdict.noise import MAX_SPREAD_TOLERANCE, default_tolerance, spread_tolerance

    # the baseline's gen in three blocks at 1.0, 0.77 and 0.80 of 0.30 s: 1.0 / 0.77 = 1.30
    base = session("base")
    base.metrics["retimed_s/gen"] = Metric([PHASES["gen"] * f * r for f in (0.77, 0.80) for r in ROUNDS], "s", False)
    run = session("run", {"gen": 1.2})  # at 1.2 / 0.8 = 1.5x the bar (0.24 s), with the same work
    run.metrics["retimed_s/gen"] = Metric([PHASES["gen"] * 1.2 * r for r in ROUNDS], "s", False)

    def gen_row(tolerance: float) -> Comparison:
        return next(c for c in compare(run, base, tolerance).comparisons if c.metric == "timing_s/gen")

    row = gen_row(default_tolerance(False))
    assert row.verdict == "fail" and row.tolerance == pytest.approx(0.30), row.message  # 1.5x > 1.30
    assert "gen's own spread, measured: the baseline timed it at 0.231-0.3 s in 3 blocks" in row.message
    run = session("run", {"gen": 1.0})  # the slower level again: 1.25x the bar, within gen's own spread
    run.metrics["retimed_s/gen"] = Metric([PHASES["gen"] * r for r in ROUNDS], "s", False)
    assert gen_row(default_tolerance(False)).verdict == "pass"
    assert gen_row(0.15).verdict == "fail"  # a tolerance someone chose is kept
    assert next(c for c in compare(run, base, default_tolerance(False)).comparisons
                if c.metric == "timing_s/ref").tolerance == pytest.approx(0.15)  # ref's one block: the default
    # the rule alone: fewer than 3 blocks or a narrower spread keep the default; the widest is capped
    default = default_tolerance(False)
    assert spread_tolerance(default, "gen", [0.3, 0.2]) is default
    assert spread_tolerance(default, "gen", [0.3, 0.29, 0.28]) is default
    assert spread_tolerance(default, "gen", [0.2, 0.3, 0.246]) == pytest.approx(0.5)
    assert spread_tolerance(default, "gen", [0.1, 0.3, 0.2]) == pytest.approx(MAX_SPREAD_TOLERANCE)


def test_a_baseline_saved_again_keeps_earlier_sessions_blocks_and_its_bar_is_their_median() -> None:
    from pytest_rlbench.records.record import Metric
    from pytest_rlbench.verdict.noise import default_tolerance
    from pytest_rlbench.verdict.retiming import (
        POOLED_SESSIONS,
        SESSION_BLOCKS,
        baseline_median,
        block_medians,
        pooled_sessions,
        retimed_blocks,
        with_earlier_sessions,
    )

    def saved(name: str, old_log_prob: float) -> RunRecord:  # a saving session: 3 blocks of each phase
        record = session(name, {"old_log_prob": old_log_prob})
        for phase, t in PHASES.items():
            f = old_log_prob if phase == "old_log_prob" else 1.0
            record.metrics[f"retimed_s/{phase}"] = Metric([t * f * r for _ in range(2) for r in ROUNDS], "s", False)
        return record

    # a session that ran old_log_prob 1.3x slow throughout sets its bar alone ...
    slow = saved("slow", 1.3)
    assert baseline_median(slow, "old_log_prob") == pytest.approx(0.13)
    # ... not once two sessions at speed were saved over it
    pooled = with_earlier_sessions(saved("b", 1.0), with_earlier_sessions(saved("a", 1.0), slow))
    assert len(retimed_blocks(pooled, "old_log_prob")) == POOLED_SESSIONS * SESSION_BLOCKS - 1
    assert pooled_sessions(pooled, "old_log_prob") == POOLED_SESSIONS
    assert baseline_median(pooled, "old_log_prob") == pytest.approx(0.10)
    assert len(block_medians(pooled, "old_log_prob")) == SESSION_BLOCKS  # the spread: this session's own
    run = session("run", {"old_log_prob": 1.25})  # a 25% regression, which the slow session hid
    run.metrics["retimed_s/old_log_prob"] = Metric([0.125 * r for r in ROUNDS], "s", False)
    judged = {c.phase: c.verdict for c in compare(run, pooled, default_tolerance(False)).comparisons}
    assert judged["old_log_prob"] == "fail" and compare(run, slow, default_tolerance(False)).passed
    # a fourth session drops the oldest's blocks; a phase timed in other rounds keeps the new blocks alone
    newest = with_earlier_sessions(saved("c", 1.3), pooled)
    assert baseline_median(newest, "old_log_prob") == pytest.approx(0.10)
    fewer = saved("d", 1.0)
    fewer.phases["ref"].seconds = fewer.phases["ref"].seconds[:4]
    assert with_earlier_sessions(fewer, pooled).metrics["retimed_s/ref"] == fewer.metrics["retimed_s/ref"]


def test_rounds_that_do_not_split_into_blocks_are_one_block() -> None:
    from pytest_rlbench.records.record import Metric
    from pytest_rlbench.verdict.retiming import retimed_blocks, retimed_rounds

    base = session("base")
    base.metrics["retimed_s/ref"] = Metric([0.1, 0.2, 0.3], "s", False)  # 3 rounds against the phase's 5
    assert retimed_blocks(base, "ref") == [(0.1, 0.2, 0.3)] and retimed_rounds(base, "ref") == (0.1, 0.2, 0.3)
    assert retimed_blocks(base, "gen") == [] and retimed_rounds(base, "gen") is None


def test_re_timed_rounds_are_paced_by_the_peers_re_timed_beside_them() -> None:
    from pytest_rlbench.records.record import Metric

    def retimed(run: RunRecord, phase: str, factor: float) -> None:
        run.metrics[f"retimed_s/{phase}"] = Metric([PHASES[phase] * factor * r for r in ROUNDS], "s", False)

    # old_log_prob 1.6x in its benchmark beside peers at 1.25-1.4x: it fails against that pace (1.28) ...
    slow_peers = {"generate_sequences": 1.25, "gen": 1.25, "ref": 1.4, "update_actor": 1.3}
    run = session("run", {"old_log_prob": 1.6, **slow_peers})
    assert verdicts(run)["old_log_prob"] == ("fail", "slower")
    # ... and re-timed at 1.3x with its peers re-timed at speed: a regression, whatever the benchmarks'
    # pace was minutes earlier (divided by it, 1.3 / 1.28 would have passed)
    retimed(run, "old_log_prob", 1.3)
    for peer in ("generate_sequences", "gen", "ref", "update_actor"):
        retimed(run, peer, 1.0)
    assert verdicts(run)["old_log_prob"] == ("fail", "slower")
    # with every peer re-timed 1.3x slower too, the host ran slower at the re-timing: not reproduced
    for peer in ("generate_sequences", "gen", "ref", "update_actor"):
        retimed(run, peer, 1.3)
    assert verdicts(run)["old_log_prob"] == ("inconclusive", "not reproduced")


def test_rounds_split_into_blocks_of_the_phases_own_rounds() -> None:
    from pytest_rlbench.verdict.retiming import blocks_of

    assert blocks_of([1, 2, 3, 4], 2) == [(1, 2), (3, 4)]
    assert blocks_of([1, 2, 3], 2) == [(1, 2, 3)]  # not split so: one block
    assert blocks_of([1, 2], None) == [(1, 2)] and blocks_of([1, 2], 0) == [(1, 2)]
    assert blocks_of([], 5) == []
