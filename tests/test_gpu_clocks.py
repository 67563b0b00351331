"""The GPU telemetry's figures and how a GPU phase's verdict reads them (no GPU needed: the figures
are written as the session records them)."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_rlbench.verdict.derived import Figure
from pytest_rlbench.verdict.judge import gate_verdict
from pytest_rlbench.verdict.machine_load import (
    POWER_CAPPED,
    SM_CLOCK,
    GpuEvidence,
    RoundTelemetry,
    clocks_explain,
    evidence,
    gpu_metric,
    per_round_figures,
    throttle_names,
)


def test_throttle_reasons_are_read_from_nvmls_bitmask() -> None:
    assert throttle_names(0x4 | 0x40 | 0x1) == ("power cap", "hardware thermal slowdown")
    assert throttle_names(0) == ()


def test_each_round_keeps_its_clocks_and_whether_the_power_cap_held_them() -> None:
    rounds = [
        RoundTelemetry(1755, 2619, 690, 700, 61, ("power cap",), 0),
        RoundTelemetry(1980, 2619, 420, 700, 58, (), 1),
    ]
    figures = per_round_figures(rounds)
    assert figures[SM_CLOCK] == [1755, 1980]
    assert figures[POWER_CAPPED] == [1.0, 0.0]
    assert figures["other_processes"] == [0.0, 1.0]


def metrics(clocks: list[float], capped: list[float] | None = None) -> dict[str, list[float]]:
    out = {gpu_metric(SM_CLOCK, "update_actor"): clocks}
    if capped is not None:
        out[gpu_metric(POWER_CAPPED, "update_actor")] = capped
    return out


def test_evidence_compares_the_median_clock_of_the_run_with_the_baselines() -> None:
    gpu = evidence(metrics([1600, 1650, 1700], [1, 1, 0]), metrics([1800, 1790, 1810]), "update_actor")
    assert gpu is not None
    assert gpu.clock_ratio == pytest.approx(1800 / 1650)
    assert gpu.power_capped == pytest.approx(2 / 3)
    assert evidence({}, metrics([1800]), "update_actor") is None  # the run recorded none


def test_clocks_explain_a_slowdown_only_as_far_as_they_went_down() -> None:
    gpu = GpuEvidence(sm_clock=1650, base_sm_clock=1800)  # 9.1% lower clocks
    assert clocks_explain(1.12, 0.05, gpu)  # 1.12 / 1.091 = 1.027: within 5%
    assert not clocks_explain(1.20, 0.05, gpu)  # 1.20 / 1.091 = 1.10: the clocks do not account for it
    assert not clocks_explain(1.04, 0.0, GpuEvidence(sm_clock=1795, base_sm_clock=1800))  # clocks equal


def fig(values: list[float]) -> Figure:
    ordered = sorted(values)
    return Figure("timing_s/update_actor", ordered[len(ordered) // 2], "s", False, tuple(values))


def test_a_slower_gpu_phase_at_lower_clocks_is_inconclusive_not_failed() -> None:
    base = fig([3.00, 3.01, 3.02, 3.00, 3.01])
    run = fig([3.36, 3.37, 3.35, 3.36, 3.38])  # 1.12x
    low_clocks = GpuEvidence(sm_clock=1650, base_sm_clock=1800)
    verdict, reason, why = gate_verdict(run, base, 0.05, 3.36, "gpu", gpu=low_clocks)
    assert (verdict, reason) == ("inconclusive", "GPU clocks"), why
    assert "SM clock 1650 vs 1800 MHz" in why
    same_clocks = GpuEvidence(sm_clock=1800, base_sm_clock=1800)
    verdict, reason, why = gate_verdict(run, base, 0.05, 3.36, "gpu", gpu=same_clocks)
    assert verdict == "fail", why
    assert "SM clock 1800 vs 1800 MHz" in why  # the failure lists the clocks it ran at


def test_other_processes_on_the_gpu_are_named_as_contention() -> None:
    base = fig([3.00, 3.01, 3.02, 3.00, 3.01])
    run = fig([3.66, 3.67, 3.65, 3.66, 3.68])
    verdict, _, why = gate_verdict(run, base, 0.05, 3.66, "gpu", gpu=GpuEvidence(1800, 1800, other_processes=2))
    assert verdict == "fail" and why.endswith("GPU contention"), why


def test_the_watch_summarises_each_marked_round_and_leaves_out_the_warm_up() -> None:
    from pytest_rlbench.session.gpu_watch import GpuWatch, _Sample

    watch = GpuWatch(["GPU-x"])
    watch._handles = ["handle"]  # as start() leaves it on a machine with the GPU
    watch._cap_w = 700.0
    # a warm-up round (t 0-1) at full clocks, then a round (t 2-3) held by the power cap at 1,650 MHz
    watch._samples = [
        _Sample(0.5, [1980.0], [2619.0], [300.0], [50.0], 0),
        _Sample(2.2, [1650.0], [2619.0], [700.0], [66.0], 0x4),
        _Sample(2.6, [1700.0], [2619.0], [690.0], [68.0], 0x4),
        _Sample(2.9, [1600.0], [2619.0], [700.0], [67.0], 0x4),
    ]
    watch._marks, watch._others = [(0.0, 1.0), (2.0, 3.0)], [set(), {4242}]
    (only,) = watch.rounds(skip=1)
    assert only.sm_clock_mhz == 1650.0 and only.temperature_c == 68.0
    assert only.throttle == ("power cap",) and only.other_processes == 1
    assert only.power_w == pytest.approx((700 + 690 + 700) / 3)


def test_each_watch_gives_its_figures_as_run_metrics_of_the_phase() -> None:
    from pytest_rlbench.session.gpu_watch import GpuWatch, _Sample
    from pytest_rlbench.verdict.machine_load import MachineWatch

    watch = GpuWatch(["GPU-x"])
    watch._handles = ["handle"]
    watch._cap_w = 700.0
    watch._samples = [_Sample(0.5, [1980.0], [2619.0], [300.0], [50.0], 0), _Sample(2.5, [1650.0], [2619.0], [700.0], [66.0], 0x4)]
    watch._marks, watch._others = [(0.0, 1.0), (2.0, 3.0)], [set(), set()]
    metrics = {metric: (values, unit) for metric, values, unit in watch.metrics("ref", warmup=1)}
    assert metrics["gpu/sm_clock_mhz/ref"] == ([1650.0], "MHz")  # the timed round's alone
    assert metrics["gpu/power_capped/ref"] == ([1.0], "")
    machine = MachineWatch()
    machine.mark_start()  # rounds are not told apart: the load is read over all of them
    machine.mark_end()
    assert machine.metrics("ref", warmup=1) == []  # never started: nothing read
    machine._load = (0.5, 0.01)
    assert machine.metrics("ref", warmup=1) == [
        ("machine/other_cores/ref", [0.5], "cores"),
        ("machine/steal_cores/ref", [0.01], "cores"),
    ]


def test_without_nvml_nothing_is_watched() -> None:
    from pytest_rlbench.session.gpu_watch import GpuWatch

    watch = GpuWatch(["GPU-not-here"])
    watch.start()  # no GPU driver on this machine, or nvidia-ml-py not installed: nothing to read
    watch.mark_start()
    watch.mark_end()
    watch.stop()
    assert not watch.available and watch.rounds() == []


def test_a_run_names_its_machine_by_a_hash_of_its_gpus_and_the_label_round_trips() -> None:
    from pytest_rlbench.records.baselines import load_baseline
    from pytest_rlbench.records.record import record_from_dict, record_to_dict
    from pytest_rlbench.session.gpu_watch import machine_label

    one = machine_label(["084c3210-a6ff-0598-62dc-b5a3ec73326e"])
    assert one is not None and one.startswith("gpus ")
    assert machine_label(["GPU-084c3210-a6ff-0598-62dc-b5a3ec73326e"]) == one  # NVML's spelling, same GPU
    assert machine_label(["9e3b21ec-0254-d5ac-2a62-e2980c4d8272"]) != one
    assert machine_label([]) is None
    baseline = load_baseline("verl-v0.5.0-1.5b")  # any record: its hardware gets a machine, then a round trip
    named = dataclasses.replace(baseline, hardware=dataclasses.replace(baseline.hardware, machine=one))
    assert record_from_dict(record_to_dict(named)).hardware.machine == one
    assert "machine" not in record_to_dict(baseline)["hardware"]  # left out while unknown: old files unchanged
