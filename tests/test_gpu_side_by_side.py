"""A GPU phase short enough to wait on the host (the embedded default's tiny model on a GPU) judged on
rounds timed side by side with its peers, as on CPU workers: a session whose host ran slower leaves it
alone, a phase slower beside its peers fails at its measured side-by-side tolerance, and a slowdown
past the largest drift measured on a GPU's host fails whatever its peers did. A GPU phase without
such rounds keeps its measured tolerance."""

from __future__ import annotations

import dataclasses
import math
import statistics
from types import SimpleNamespace

import pytest
from test_side_by_side import counted, session

from pytest_rlbench.records.record import RunRecord
from pytest_rlbench.session.bench import side_by_side_limit, side_by_side_rule
from pytest_rlbench.session.gate_items import side_by_side_benches
from pytest_rlbench.verdict.compare import compare
from pytest_rlbench.verdict.judge import GPU_HOST_DRIFT_LIMIT, HOST_DRIFT_LIMIT
from pytest_rlbench.verdict.noise import (
    GPU_SIDE_BY_SIDE_MAX_ROUND_S,
    GPU_SIDE_BY_SIDE_TOLERANCES,
    default_tolerance,
)
from pytest_rlbench.verdict.retiming import (
    GPU_SIDE_BY_SIDE_PASSES,
    SIDE_BY_SIDE_PASSES,
    reads_side_by_side,
    side_by_side_passes,
    side_by_side_rounds,
)
from pytest_rlbench.verdict.session_pace import pace_min_s, side_by_side

H200 = {"device": "gpu", "gpus_per_node": 1, "world_size": 1, "gpu_model": "NVIDIA H200", "cpu_model": None,
        "cpus_per_node": 16}


def on_gpu(record: RunRecord) -> RunRecord:
    """``record`` as a session on one H200."""
    return dataclasses.replace(record, hardware=dataclasses.replace(record.hardware, **H200))


def gpu_session(name: str, **kwargs) -> RunRecord:
    return on_gpu(session(name, **kwargs))


def row(run: RunRecord, base: RunRecord, phase: str):
    result = compare(run, base, default_tolerance(gpu=True))
    assert result.mode == "gate", result.mismatches
    return next(c for c in result.comparisons if c.metric == f"timing_s/{phase}")


def test_gpu_sessions_time_the_phases_that_wait_on_the_host_side_by_side_in_more_passes() -> None:
    assert side_by_side_limit(gpu=False) == math.inf  # every phase on CPU workers
    assert side_by_side_limit(gpu=True) == GPU_SIDE_BY_SIDE_MAX_ROUND_S < 10  # not a real model's gen
    assert (side_by_side_passes(False), side_by_side_passes(True)) == (SIDE_BY_SIDE_PASSES, GPU_SIDE_BY_SIDE_PASSES)
    # save_checkpoint's 30 ms witnesses the host's speed on a GPU, not on CPU workers
    assert pace_min_s("gpu") < 0.03 < pace_min_s("cpu")
    evidence = side_by_side(gpu_session("run"), gpu_session("base"), "update_actor")
    assert evidence is not None and ("save_checkpoint",) in evidence.groups, evidence
    cpu = side_by_side(session("run"), session("base"), "update_actor")
    assert cpu is not None and ("save_checkpoint",) not in cpu.groups


def test_a_gpu_baseline_reads_side_by_side_only_where_it_timed_phases_so() -> None:
    assert reads_side_by_side(session("cpu", side=False), gpu=False)  # CPU: the session times them anyway
    assert reads_side_by_side(gpu_session("gpu"), gpu=True)
    assert not reads_side_by_side(gpu_session("gpu, saved before", side=False), gpu=True)
    # another device's baseline is only a reference: no pass is timed for it
    assert not reads_side_by_side(session("cpu"), gpu=True)
    assert not reads_side_by_side(gpu_session("gpu"), gpu=False)


def test_which_phases_keep_a_round_timer_for_the_passes() -> None:
    def state(gpu: bool, save: bool = False, baselines=(), gating: bool = True):
        opts = SimpleNamespace(gpu=gpu, save_baseline="b.json" if save else None)
        return SimpleNamespace(opts=opts, baseline_records=list(baselines), gating=gating)

    limit = GPU_SIDE_BY_SIDE_MAX_ROUND_S
    # a session that neither gates nor saves makes no gate: nothing kept alive
    assert not side_by_side_rule(state(gpu=False, gating=False))("gen", 0.1)
    assert not side_by_side_rule(state(gpu=True, gating=False))("gen", 0.1)
    assert side_by_side_rule(state(gpu=False, gating=False, save=True))("gen", 100.0)  # CPU: every phase
    saving = side_by_side_rule(state(gpu=True, gating=False, save=True))
    assert saving("gen", limit - 0.1) and not saving("gen", limit + 0.1)  # GPUs: the phases that wait on the host
    # gated against a GPU baseline that timed step side by side, a step the change made slower than the
    # limit keeps its timer, up to the largest drift of a GPU's host past its rounds there
    base = gpu_session("base", beside=2.0)
    there = {p: statistics.median(r) for p, r in side_by_side_rounds(base).items()}
    assert there["step"] > limit / GPU_HOST_DRIFT_LIMIT > there["update_actor"], there
    gating = side_by_side_rule(state(gpu=True, baselines=[base]))
    assert gating("step", limit + 0.1) and gating("step", GPU_HOST_DRIFT_LIMIT * there["step"] * 0.99)
    assert not gating("step", GPU_HOST_DRIFT_LIMIT * there["step"] * 1.01)
    assert not gating("update_actor", limit + 0.1)
    older = side_by_side_rule(state(gpu=True, baselines=[gpu_session("base", beside=2.0, side=False)]))
    assert not older("step", limit + 0.5) and older("step", limit - 0.1)
    # a CPU baseline's passes say nothing of a GPU session's phases (it is only a reference there)
    cpu_base = side_by_side_rule(state(gpu=True, baselines=[session("base", beside=2.0)]))
    assert not cpu_base("step", limit + 0.1)


def test_a_gpu_session_whose_host_ran_slower_is_not_failed() -> None:
    # every phase 1.6x in seconds (unchanged sessions of the tiny model moved so), alike beside its peers
    run, base = gpu_session("run", seconds=1.6), gpu_session("base")
    judged = row(run, base, "update_actor")
    assert (judged.verdict, judged.reason) == ("inconclusive", "session slower"), judged.message
    assert "not beside its peers: timed side by side with" in judged.message
    # with the same counted work it passes (the same work ran slower with every phase alike)
    judged = row(counted(gpu_session("run", seconds=1.6)), counted(gpu_session("base")), "update_actor")
    assert (judged.verdict, judged.reason) == ("pass", "same work"), judged.message
    # without side-by-side rounds the measured tolerance of a second-long phase fails it, and says why
    plain = row(gpu_session("run", seconds=1.6, side=False), gpu_session("base", side=False), "update_actor")
    assert plain.verdict == "fail" and "waits on the host" in plain.message, plain.message


def test_a_gpu_phase_slower_beside_its_peers_fails_past_its_side_by_side_tolerance() -> None:
    allowed = GPU_SIDE_BY_SIDE_TOLERANCES["update_actor"]
    base = gpu_session("base")
    slower = row(gpu_session("run", slower={"update_actor": 1 + allowed + 0.1}), base, "update_actor")
    assert (slower.verdict, slower.reason) == ("fail", "slower"), slower.message
    assert slower.tolerance == pytest.approx(allowed)
    assert "update_actor's measured side-by-side spread on GPU" in slower.message
    within = row(gpu_session("run", slower={"update_actor": 1 + allowed - 0.04}), base, "update_actor")
    assert within.verdict == "pass", within.message
    # a phase without a measured side-by-side spread keeps the default
    assert row(gpu_session("run"), base, "reward").tolerance == pytest.approx(0.10)


def test_past_the_largest_drift_of_a_gpu_s_host_a_phase_fails_whatever_its_peers_did() -> None:
    assert GPU_HOST_DRIFT_LIMIT > HOST_DRIFT_LIMIT  # the tiny model's phases moved by up to 2x on a GPU's host
    base = gpu_session("base")
    within = row(gpu_session("run", seconds=GPU_HOST_DRIFT_LIMIT - 0.1), base, "update_actor")
    assert (within.verdict, within.reason) == ("inconclusive", "session slower"), within.message
    past = row(gpu_session("run", seconds=GPU_HOST_DRIFT_LIMIT + 0.1), base, "update_actor")
    assert past.verdict == "fail", past.message
    assert f"past the largest drift of a whole session measured on a GPU's host ({GPU_HOST_DRIFT_LIMIT:g}x)" in past.message


def test_a_gpu_session_times_side_by_side_only_where_every_phase_waits_on_the_host() -> None:
    ran = ["test_gen", "test_ref", "test_update_actor", "test_step"]
    short = ["test_ref", "test_update_actor", "test_step"]  # gen's rounds took seconds: no round timer
    assert side_by_side_benches(ran, short, gpu=False) == short  # CPU workers: each that kept one
    assert side_by_side_benches(ran, short, gpu=True) == []  # a real model's session: measured tolerances
    assert side_by_side_benches(ran, ran, gpu=True) == ran  # a small model's: every phase
