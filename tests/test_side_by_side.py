"""A CPU phase judged on rounds timed side by side with its peers: each pass's round divided by the
host's speed in that pass, read from its peers, so a host whose speed moves from pass to pass leaves
the verdict alone, a phase slower in seconds and beside its peers fails, and peers the code made
faster fail nothing."""

from __future__ import annotations

import copy
import json

import pytest
from test_bench_gate import PASSING_SLOWDOWN, steady_machine  # noqa: F401  (steady_machine: a fixture)
from test_session_pace import BASE, PHASES, ROUNDS  # the embedded default's shape, as a record

from pytest_rlbench.records.record import Metric, RunRecord, record_from_dict
from pytest_rlbench.verdict.compare import compare
from pytest_rlbench.verdict.judge import WorkEvidence, with_work
from pytest_rlbench.verdict.noise import default_tolerance
from pytest_rlbench.verdict.retiming import (
    POOLED_SESSIONS,
    SIDE_BY_SIDE_PASSES,
    side_by_side_metric,
    side_by_side_rounds,
    with_earlier_sessions,
)
from pytest_rlbench.verdict.session_pace import host_speeds, paced_rounds, peer_groups, side_by_side

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


def counted(record: RunRecord, ops: dict[str, float] | None = None) -> RunRecord:
    """``record`` with each phase's counted work: 1,000 ops, or as ``ops`` says."""
    for p in PHASES:
        record.metrics[f"work/ops/{p}"] = Metric([(ops or {}).get(p, 1000.0)], "ops", False)
    return record


def row(run: RunRecord, base: RunRecord, phase: str, tolerance: float = 0.15):
    result = compare(run, base, tolerance)
    assert result.mode == "gate", result.mismatches
    return next(c for c in result.comparisons if c.metric == f"timing_s/{phase}")


def test_the_host_s_speed_in_a_pass_is_the_median_of_its_peer_groups() -> None:
    # gen and generate_sequences are the same work timed twice: one group
    assert peer_groups(["generate_sequences", "gen", "ref", "update_actor"]) == [
        ("generate_sequences", "gen"), ("ref",), ("update_actor",)
    ]
    rounds = {"a": [1.0, 2.0, 0.5], "b": [2.0, 4.0, 1.0], "c": [0.5, 1.0, 0.3], "d": [3.0, 6.0, 0.0]}
    speeds = host_speeds(rounds, [("b",), ("c",), ("d",)], [2.0, 0.5, 3.0])
    assert speeds == pytest.approx([1.0, 2.0, 0.0])  # a pass where a peer took no time says nothing
    assert paced_rounds(rounds["a"], speeds) == pytest.approx((1.0, 1.0))
    # one group the code made 3x faster does not move the median of three
    faster = {**rounds, "c": [x / 3 for x in rounds["c"]]}
    assert host_speeds(faster, [("b",), ("c",), ("d",)], [2.0, 0.5, 3.0])[:2] == pytest.approx([1.0, 2.0])


def test_a_host_that_moved_from_pass_to_pass_leaves_the_verdict_alone() -> None:
    run, base = session("run", seconds=1.3, host=tuple(reversed(HOST))), session("base")
    evidence = side_by_side(run, base, "old_log_prob")
    assert evidence is not None and evidence.ratio == pytest.approx(1.0, abs=0.03), evidence
    assert evidence.groups == (("generate_sequences", "gen"), ("ref",), ("update_actor",))
    judged = row(run, base, "update_actor")  # 1.3x in seconds, as its peers beside it
    assert (judged.verdict, judged.reason) == ("inconclusive", "session slower"), judged.message
    assert "not beside its peers: timed side by side with" in judged.message
    assert "re-timed" not in judged.message  # side by side stood in for the re-timing


def test_a_phase_slower_in_seconds_and_beside_its_peers_fails() -> None:
    run = session("run", seconds=1.1, slower={"old_log_prob": 1.25})
    judged = row(run, session("base"), "old_log_prob")
    assert (judged.verdict, judged.reason) == ("fail", "slower"), judged.message
    assert "slower in seconds at ratio 1.38" in judged.message and "it was at ratio 1.25" in judged.message
    assert row(run, session("base"), "ref").verdict == "pass"


def test_peers_the_code_made_faster_fail_no_phase_beside_them() -> None:
    # update_actor twice as fast: one peer group of three, the host's speed of each pass stays put
    for seconds, expected in ((1.0, ("pass", "within tolerance")), (1.3, ("inconclusive", "session slower"))):
        run = session("run", seconds=seconds, slower={"update_actor": 0.5})
        for phase in ("old_log_prob", "ref", "gen", "generate_sequences"):
            judged = row(run, session("base"), phase)
            assert (judged.verdict, judged.reason) == expected, judged.message
    # every training phase 25% faster: beside them generation looks slower, but not in seconds
    faster = {"old_log_prob": 0.75, "ref": 0.75, "update_actor": 0.75}
    judged = row(session("run", slower=faster), session("base"), "gen")
    assert (judged.verdict, judged.reason) == ("inconclusive", "slower beside its peers"), judged.message
    assert "or its peers made faster by the change" in judged.message


def test_a_phase_within_the_tolerance_in_seconds_but_slower_beside_its_peers_is_inconclusive() -> None:
    # a session that ran fast: old_log_prob 25% slower is 1.06x in seconds, within the tolerance
    run = session("run", seconds=0.85, slower={"old_log_prob": 1.25})
    judged = row(run, session("base"), "old_log_prob")
    assert (judged.verdict, judged.reason) == ("inconclusive", "slower beside its peers"), judged.message
    assert compare(run, session("base"), 0.15).passed  # reported, not failing the session
    # where every peer did the same counted work as in the baseline, the code did not make them faster:
    # this phase is slower, by what the counters cannot see
    counted_run, counted_base = counted(run), counted(session("base"))
    judged = row(counted_run, counted_base, "old_log_prob")
    assert (judged.verdict, judged.reason) == ("fail", "slower beside its peers"), judged.message
    assert "its peers did the same counted work as in the baseline" in judged.message
    fewer = counted(session("run", seconds=0.85, slower={"old_log_prob": 1.25}), {"ref": 800.0, "update_actor": 800.0})
    assert row(fewer, counted_base, "old_log_prob").verdict == "inconclusive"  # peers that did less work
    # with more counted work of its own it is a regression
    more = WorkEvidence({"ops": 1100.0}, {"ops": 1000.0})
    flagged = ("inconclusive", "slower beside its peers")
    assert with_work(*flagged, "", more)[:2] == ("fail", "more work")
    same = WorkEvidence({"ops": 1000.0}, {"ops": 1000.0})
    assert with_work(*flagged, "", same)[:2] == flagged


def test_generation_is_judged_at_its_measured_side_by_side_tolerance() -> None:
    default = default_tolerance(gpu=False)
    base = session("base")
    within = row(session("run", slower={"gen": 1.2}), base, "gen", default)
    assert within.verdict == "pass" and within.tolerance == pytest.approx(0.25), within.message
    assert "gen's measured side-by-side spread on CPU" in within.message
    beyond = row(session("run", slower={"gen": 1.35}), base, "gen", default)
    assert beyond.verdict == "fail", beyond.message
    assert row(session("run", slower={"ref": 1.2}), base, "ref", default).verdict == "fail"  # ref at 0.15


def test_under_contention_plain_seconds_decide_and_a_failure_is_re_timed() -> None:
    run = session("run", slower={"old_log_prob": 1.4})
    run.metrics["machine/other_cores/old_log_prob"] = Metric([1.2], "cores", False)
    assert side_by_side(run, session("base"), "old_log_prob") is not None
    judged = row(run, session("base"), "old_log_prob")
    assert judged.verdict == "fail" and "CPU contention" in judged.message and "side by side" not in judged.message


def test_the_own_spread_of_the_baseline_s_blocks_does_not_widen_a_side_by_side_verdict() -> None:
    base = session("base")
    # the baseline's benchmark and two re-timed blocks of old_log_prob 40% apart
    base.metrics["retimed_s/old_log_prob"] = Metric([0.14 * r for r in ROUNDS] + [0.12 * r for r in ROUNDS], "s", False)
    judged = row(session("run", slower={"old_log_prob": 1.45}), base, "old_log_prob", default_tolerance(gpu=False))
    assert judged.tolerance == pytest.approx(0.15) and judged.verdict == "fail", judged.message
    plain = row(session("run", slower={"old_log_prob": 1.45}, side=False), session("base", side=False) , "ref")
    assert plain.verdict == "pass"


def test_a_baseline_without_side_by_side_rounds_is_read_on_the_session_s_pace() -> None:
    run, base = session("run", seconds=1.3), session("base", side=False)
    assert side_by_side(run, base, "old_log_prob") is None
    judged = row(run, base, "old_log_prob")
    assert judged.reason == "session slower" and "the session's other phases ran at" in judged.message


def test_a_baseline_saved_again_pools_each_session_s_passes_as_passes() -> None:
    sessions = [session(f"s{i}", host=HOST[i:] + HOST[:i]) for i in range(POOLED_SESSIONS + 1)]
    pooled = sessions[0]
    for newer in sessions[1:]:
        pooled = with_earlier_sessions(newer, pooled)
    rounds = side_by_side_rounds(pooled)
    n = SIDE_BY_SIDE_PASSES
    assert {len(v) for v in rounds.values()} == {POOLED_SESSIONS * n}
    for age, earlier in enumerate(reversed(sessions[1:])):  # the newest first, each session's passes whole
        own = side_by_side_rounds(earlier)
        assert all(rounds[p][age * n : (age + 1) * n] == own[p] for p in rounds), age
    # a session that timed other phases side by side is not pooled with them (its passes would not line up)
    other = session("other")
    del other.metrics[side_by_side_metric("ref")]
    assert side_by_side_rounds(with_earlier_sessions(other, pooled)) == side_by_side_rounds(other)


# test_bench_gate's old_log_prob slow in its first rounds beside an update_actor, and two phases more:
# four phases, so that each has three peers side by side
SLEEPING_SUITE = PASSING_SLOWDOWN + """
@pytest.mark.rl_phase("ref")
def test_ref(rl_bench):
    rl_bench(lambda: time.sleep(0.06))

@pytest.mark.rl_phase("gen")
def test_gen(rl_bench):
    rl_bench(lambda: time.sleep(0.08))
"""


IN_PROCESS = pytest.mark.usefixtures("plugin_deps_loaded", "steady_machine")  # tests/conftest.py, test_bench_gate


def sleeping_session(pytester: pytest.Pytester, first: float, later: float, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_suite=SLEEPING_SUITE.format(first=first, later=later))
    return pytester.runpytest("--rl-rounds=5", "--rl-warmup-rounds=1", "-p", "no:randomly", *args)


@IN_PROCESS
@pytest.mark.parametrize(("later", "verdict", "reason"), [(0.05, "inconclusive", "session slower"), (0.10, "fail", "slower")])
def test_a_real_session_times_its_phases_side_by_side_and_they_decide(
    pytester: pytest.Pytester, later: float, verdict: str, reason: str
) -> None:
    """Four phases timed side by side at the first gate, 12 passes each; old_log_prob slow in its
    benchmark only is the host's (its passes ran as its peers'), slow in its passes too a regression."""
    saved, report = pytester.path / "base.json", pytester.path / "r.json"
    sleeping_session(pytester, 0.05, 0.05, f"--rl-save-baseline={saved}").assert_outcomes(passed=8)
    base = json.loads(saved.read_text())["metrics"]
    phases = ("old_log_prob", "ref", "update_actor", "gen")
    assert {len(base[side_by_side_metric(p)]["value"]) for p in phases} == {SIDE_BY_SIDE_PASSES}
    # 1.5x in its benchmark: past the tolerance, short of the largest host drift
    result = sleeping_session(pytester, 0.075, later, f"--rl-baseline={saved}", f"--rl-report={report}")
    data = json.loads(report.read_text())
    row = next(c for c in data["comparisons"] if c["metric"] == "timing_s/old_log_prob")
    assert (row["verdict"], row["reason"]) == (verdict, reason), row["message"]
    assert "timed side by side with update_actor, ref, gen" in row["message"]
    assert "retimed_s/old_log_prob" not in data["metrics"]  # side by side stood in for the re-timing
    result.assert_outcomes(passed=8 if verdict == "inconclusive" else 7, failed=0 if verdict == "inconclusive" else 1)


@IN_PROCESS
def test_against_a_baseline_without_side_by_side_rounds_a_failure_is_still_re_timed(pytester: pytest.Pytester) -> None:
    saved, report = pytester.path / "base.json", pytester.path / "r.json"
    sleeping_session(pytester, 0.05, 0.05, f"--rl-save-baseline={saved}").assert_outcomes(passed=8)
    old = json.loads(saved.read_text())
    old["metrics"] = {m: v for m, v in old["metrics"].items() if not m.startswith("side_by_side_s/")}
    saved.write_text(json.dumps(old))  # as saved before side by side existed
    sleeping_session(pytester, 0.075, 0.05, f"--rl-baseline={saved}", f"--rl-report={report}")
    data = json.loads(report.read_text())
    row = next(c for c in data["comparisons"] if c["metric"] == "timing_s/old_log_prob")
    assert len(data["metrics"]["retimed_s/old_log_prob"]["samples"]) == 5, row["message"]
    assert (row["verdict"], row["reason"]) == ("inconclusive", "not reproduced"), row["message"]
