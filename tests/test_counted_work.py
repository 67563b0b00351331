"""Counted work beside a phase's time (``WorkEvidence`` in pytest_rlbench/verdict/judge.py, trainer/work_counts.py):
a session slower alike with more work in a phase fails that phase; with the same work it passes and
says why; a phase within the tolerance that dispatched more and ran slower fails; the counts are
evidence, never judged rows; and what the counters count."""

from __future__ import annotations

import dataclasses

import torch
from test_session_pace import session

from pytest_rlbench.records.record import Metric, RunRecord
from pytest_rlbench.verdict.compare import compare, counted_work, custom_metrics
from pytest_rlbench.verdict.judge import FLOPS, OPS, WORK_ALLOWANCE, WorkEvidence, with_work, work_metric
from trainer.work_counts import WorkCounts, count_work


def with_counts(record: RunRecord, counts: dict[str, tuple[float, float]]) -> RunRecord:
    """``record`` with each phase's (ops, flops) as its work/* metrics."""
    metrics = dict(record.metrics)
    for phase, (ops, flops) in counts.items():
        metrics[work_metric(OPS, phase)] = Metric(value=[ops], unit="ops", higher_is_better=False)
        metrics[work_metric(FLOPS, phase)] = Metric(value=[flops], unit="FLOP", higher_is_better=False)
    return dataclasses.replace(record, metrics=metrics)


BASE_WORK = {"old_log_prob": (1019, 2.4e9), "ref": (1019, 2.4e9), "update_actor": (3540, 7.1e9)}


def timings(run: RunRecord, base: RunRecord) -> dict[str, object]:
    result = compare(run, base, 0.20)
    assert result.mode == "gate", result.mismatches
    return {c.phase: c for c in result.comparisons if c.metric.startswith("timing_s/")}


def test_a_session_slower_alike_with_more_work_in_a_phase_fails_that_phase() -> None:
    base = with_counts(session("base"), BASE_WORK)
    more = with_counts(session("run", everything=1.3), {**BASE_WORK, "update_actor": (7080, 14.2e9)})
    judged = timings(more, base)
    update = judged["update_actor"]
    assert (update.verdict, update.reason) == ("fail", "more work"), update.message
    assert "ops 3,540 -> 7,080" in update.message and "FLOPs 7.1e+09 -> 1.42e+10" in update.message
    # the pace that excused the time is still named
    assert "session's other phases ran at 1.30x" in update.message
    # the phases whose work did not change pass: the same work ran slower alike, the machine's doing
    ref = judged["ref"]
    assert (ref.verdict, ref.reason) == ("pass", "same work"), ref.message
    assert "the time alone: session slower" in ref.message and "the work was the same (ops 1,019 -> 1,019" in ref.message
    assert "cannot see a slower kernel doing the same work" in ref.message
    # without the counts the same session abstains on update_actor
    assert timings(session("run", everything=1.3), session("base"))["update_actor"].verdict == "inconclusive"


def test_more_work_alone_fails_nothing_and_is_shown_beside_the_time() -> None:
    base = with_counts(session("base"), BASE_WORK)
    run = with_counts(session("run"), {**BASE_WORK, "update_actor": (7080, 14.2e9)})
    update = timings(run, base)["update_actor"]
    assert update.verdict == "pass" and update.message.endswith(
        "; ops 3,540 -> 7,080, FLOPs 7.1e+09 -> 1.42e+10"
    )


def test_more_work_with_rounds_slower_within_the_tolerance_fails() -> None:
    base = with_counts(session("base"), BASE_WORK)
    # update_actor 10% slower (every round past every baseline round), the tolerance 20%
    slower = session("run", {"update_actor": 1.10})
    update = timings(with_counts(slower, {**BASE_WORK, "update_actor": (3560, 7.9e9)}), base)["update_actor"]
    assert (update.verdict, update.reason) == ("fail", "more work"), update.message
    assert "within tolerance, but 10% slower than the baseline against the session's pace" in update.message
    assert "FLOPs 7.1e+09 -> 7.9e+09" in update.message
    # one slow baseline round does not hide it: the medians decide, not the rank test
    outlier = with_counts(session("base"), BASE_WORK)
    rounds = list(outlier.phases["update_actor"].seconds)
    rounds[2] *= 1.3
    outlier = dataclasses.replace(
        outlier, phases={**outlier.phases, "update_actor": dataclasses.replace(outlier.phases["update_actor"], seconds=rounds)}
    )
    update = timings(with_counts(slower, {**BASE_WORK, "update_actor": (3560, 7.9e9)}), outlier)["update_actor"]
    assert (update.verdict, update.reason) == ("fail", "more work"), update.message
    # the same rounds with the same work pass: the time alone is within the tolerance
    same = timings(with_counts(slower, BASE_WORK), base)["update_actor"]
    assert (same.verdict, same.reason) == ("pass", "within tolerance"), same.message
    # more work whose rounds are slower only as fast as the whole session is: the session's pace
    alike = with_counts(session("run", everything=1.10), {**BASE_WORK, "update_actor": (3560, 7.9e9)})
    update = timings(alike, base)["update_actor"]
    assert (update.verdict, update.reason) == ("pass", "within tolerance"), update.message


def test_the_counts_are_evidence_never_judged_rows() -> None:
    base = with_counts(session("base"), BASE_WORK)
    run = with_counts(session("run"), {**BASE_WORK, "update_actor": (7080, 14.2e9)})
    assert not any(m.startswith("work/") for m in custom_metrics(run, base))
    assert not any(c.metric.startswith("work/") for c in compare(run, base, 0.20).comparisons)


def test_more_means_past_the_allowance_and_on_both_sides() -> None:
    grown = 1019 * (1 + WORK_ALLOWANCE)
    assert not WorkEvidence({OPS: grown}, {OPS: 1019}).more
    assert WorkEvidence({OPS: grown + 1}, {OPS: 1019}).more
    assert WorkEvidence({OPS: 1019, FLOPS: 3e9}, {OPS: 1019, FLOPS: 2e9}).more  # FLOPs count too
    assert not WorkEvidence({OPS: 1019, FLOPS: 3e9}, {OPS: 1019}).more  # a count one side lacks: no change
    assert WorkEvidence({OPS: 1019, FLOPS: 0}, {OPS: 1019, FLOPS: 0}).same
    assert not WorkEvidence({OPS: 900}, {OPS: 1019}).same  # fewer, past the allowance
    assert WorkEvidence({OPS: 1403}, {OPS: 1401}).same  # fsdp2's update_actor, call to call
    assert not WorkEvidence({OPS: 1403}, {OPS: 1401}).identical
    # a phase counted on one side only is no evidence
    counted, bare = with_counts(session("run"), {"ref": (10, 0)}), session("base")
    assert counted_work(counted, bare, "ref") is None and counted_work(bare, counted, "ref") is None
    assert counted_work(counted, counted, "ref") == WorkEvidence(
        {OPS: 10.0, FLOPS: 0.0}, {OPS: 10.0, FLOPS: 0.0}
    )


def test_the_rule_on_each_verdict() -> None:
    more = WorkEvidence({OPS: 20}, {OPS: 10})
    same = WorkEvidence({OPS: 10}, {OPS: 10})
    fewer = WorkEvidence({OPS: 5}, {OPS: 10})
    for excused in ("session slower", "not reproduced", "GPU clocks"):
        assert with_work("inconclusive", excused, "", more)[:2] == ("fail", "more work")
        assert with_work("inconclusive", excused, "", fewer)[:2] == ("inconclusive", excused)
        passed = with_work("inconclusive", excused, "", same)
        assert passed[:2] == ("pass", "same work") and "the work was the same" in passed[2]
        # a few more ops (gradient checkpointing's wrappers in gen: 16,917 -> 17,109) explain no slower time
        few_more = with_work("inconclusive", excused, "", WorkEvidence({OPS: 17109}, {OPS: 16917}))
        assert (
            few_more[:2] == ("pass", "same work")
            and "the work was within 5% of the baseline's" in few_more[2]
        )
    # an inconclusive that did not find the time slower stays as it was: more work is not a slower time
    assert with_work("inconclusive", "too few rounds", "", more)[:2] == ("inconclusive", "too few rounds")
    # a failure stays a failure (a slower kernel does the same work), with its counts for the record
    assert with_work("fail", "slower", " (p = 0.004)", same) == (
        "fail",
        "slower",
        " (p = 0.004); ops 10 -> 10",
    )
    assert with_work("pass", "within tolerance", "", same) == ("pass", "within tolerance", "")
    assert with_work("pass", "within tolerance", "", None) == ("pass", "within tolerance", "")
    # a pass with more work fails only where its median was slower past the allowance (and the floor)
    assert with_work("pass", "within tolerance", "", more, slower_by=0.10)[:2] == ("fail", "more work")
    assert with_work("pass", "within tolerance", "", more, slower_by=0.04)[:2] == ("pass", "within tolerance")
    assert with_work("pass", "within tolerance", "", more, slower_by=None)[:2] == ("pass", "within tolerance")
    assert with_work("pass", "within tolerance", "", same, slower_by=0.10)[:2] == ("pass", "within tolerance")


def test_count_work_counts_dispatched_ops_and_flops() -> None:
    a, b = torch.ones(2, 3), torch.ones(3, 4)
    result, work = count_work(lambda: (a @ b).sum())
    assert float(result) == 24.0
    assert work == WorkCounts(ops=2, flops=2 * 2 * 3 * 4)  # mm and sum; FLOPs of the matmul alone
    _, twice = count_work(lambda: [(a @ b).sum() for _ in range(2)])
    assert twice == work + work
    assert count_work(lambda: None)[1] == WorkCounts()
