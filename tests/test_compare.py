"""The comparison gate: gate or reference, thresholds, the rank test and the noise floor, missing and
not-run metrics, tolerances."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from shared_parts import tiny_record

from pytest_rlbench.records.baselines import load_baseline
from pytest_rlbench.records.record import RunRecord, record_from_dict
from pytest_rlbench.verdict.compare import compare, gate_mismatches, tolerance_for
from pytest_rlbench.verdict.judge import time_gap_s
from pytest_rlbench.verdict.noise import (
    DEFAULT_TOLERANCE,
    GPU_PHASE_TOLERANCES,
    GPU_SAME_MACHINE_TOLERANCES,
    default_tolerance,
)

BASE: dict[str, Any] = tiny_record(
    "local-ci",
    {"device": "gpu", "nodes": 1, "gpus_per_node": 1, "world_size": 1, "gpu_model": "NVIDIA H100 80GB HBM3"},
    {"gen": {"seconds": 2.0}, "update_actor": {"seconds": 1.0}, "step": {"seconds": 4.0}},
    provenance={"source": "pytest-rlbench run"},
    tokens={"prompt_lengths": [4, 4, 4, 4], "response_lengths": [16, 16, 16, 16], "decode_steps": 16},
)


def record(name: str = "run", **changes: Any) -> RunRecord:
    data = copy.deepcopy(BASE)
    data["name"] = name
    for section, value in changes.items():
        data[section] = {**data.get(section, {}), **value} if isinstance(value, dict) else value
    return record_from_dict(data)


def by_metric(result) -> dict:
    return {c.metric: c for c in result.comparisons}


def test_same_work_same_hardware_is_a_gate() -> None:
    result = compare(record(), record("local-ci"))
    assert result.mode == "gate" and result.mismatches == ()
    assert result.passed
    # one verdict per measurement: each phase's time is judged, its throughput listed beside it
    verdicts = {c.metric: c.verdict for c in result.comparisons}
    assert {v for m, v in verdicts.items() if m.startswith("timing_s/")} == {"pass"}
    assert {v for m, v in verdicts.items() if m.startswith("tokens_per_s_per_gpu/")} == {"reference"}
    # times and throughputs the baseline has; efficiency figures are not listed
    assert set(by_metric(result)) == {
        "timing_s/gen",
        "tokens_per_s_per_gpu/gen",
        "timing_s/update_actor",
        "tokens_per_s_per_gpu/update_actor",
        "timing_s/step",
        "tokens_per_s_per_gpu/step",
    }


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"hardware": {"gpu_model": "NVIDIA A100-SXM4-80GB"}}, "hardware.gpu_model: run 'a100-sxm4-80gb', baseline 'h100 80gb hbm3'"),
        ({"hardware": {"nodes": 2, "world_size": 2}}, "hardware.nodes: run 2, baseline 1"),
        ({"config": {"rollout_n": 4}}, "config.rollout_n: run 4, baseline 2"),
        ({"config": {"max_response_length": 32}}, "config.max_response_length: run 32, baseline 16"),
        ({"model": {"num_layers": 3}}, "model: run 'tiny', baseline 'tiny' (differ in num_layers)"),
        ({"model": {"dtype": "float16", "head_dim": 8}}, "model: run 'tiny', baseline 'tiny' (differ in head_dim, dtype)"),
    ],
)
def test_different_work_or_hardware_is_a_reference(changes: dict, expected: str) -> None:
    result = compare(record(**changes), record("local-ci"))
    assert result.mode == "reference"
    assert expected in result.mismatches
    assert result.passed and {c.verdict for c in result.comparisons} == {"reference"}


def test_gpu_names_compare_without_case_or_vendor_prefix() -> None:
    assert gate_mismatches(record(hardware={"gpu_model": "h100 80GB  HBM3"}), record()) == []


def test_the_builtin_baselines_are_references_with_efficiency_side_by_side() -> None:
    builtin = load_baseline("verl-v0.5.0-1.5b")
    result = compare(record(), builtin)
    assert result.mode == "reference"
    assert "config.train_batch_size: not stated in the baseline" in result.mismatches
    rows = by_metric(result)
    assert rows["timing_s/gen"].baseline == 260.922 and rows["timing_s/gen"].verdict == "reference"
    assert rows["mfu/update_actor"].measured is not None
    # the baseline's MFU follows from its published time and its workload's token counts
    assert rows["mfu/update_actor"].baseline == pytest.approx(0.2304, abs=1e-4)
    assert rows["bandwidth_util/gen"].measured is not None
    cpu = record(hardware={"device": "cpu", "gpus_per_node": None, "gpu_model": None, "cpu_model": "x86", "cpus_per_node": 8})
    assert "hardware.device: run 'cpu', baseline 'gpu'" in compare(cpu, load_baseline("verl-7b")).mismatches


def test_slower_than_tolerance_fails_with_a_message_naming_phase_metric_baseline_and_ratio() -> None:
    result = compare(record(phases={**BASE["phases"], "update_actor": {"seconds": 1.32}}), record("local-ci"))
    row = by_metric(result)["timing_s/update_actor"]
    assert (row.verdict, row.reason) == ("fail", "slower")
    assert row.ratio == pytest.approx(1.32)
    assert row.message == (
        "update_actor seconds: 1.32 s vs 1.00 s in baseline 'local-ci' (ratio 1.32, tolerance 0.10): slower "
        "(rests on one figure: the baseline has a single value, so no rank test); "
        "tokens/s per GPU 60.61 tokens/s/GPU vs 80.00 tokens/s/GPU"
    )
    # the same measurement's throughput is listed beside the time, not a second regression
    throughput = by_metric(result)["tokens_per_s_per_gpu/update_actor"]
    assert (throughput.verdict, throughput.ratio) == ("reference", pytest.approx(1 / 1.32))
    assert not result.passed
    assert {c.metric for c in result.failures} == {"timing_s/update_actor"}


def test_threshold_edges() -> None:
    base = record("local-ci")
    assert by_metric(compare(record(phases={**BASE["phases"], "update_actor": {"seconds": 1.09}}), base))[
        "timing_s/update_actor"
    ].verdict == "pass"
    assert by_metric(compare(record(phases={**BASE["phases"], "update_actor": {"seconds": 1.11}}), base))[
        "timing_s/update_actor"
    ].verdict == "fail"
    faster = by_metric(compare(record(phases={**BASE["phases"], "update_actor": {"seconds": 0.5}}), base))
    assert faster["timing_s/update_actor"].verdict == "pass"
    assert faster["tokens_per_s_per_gpu/update_actor"].ratio == pytest.approx(2.0)


BASE_ROUNDS = [0.9, 1.0, 1.05, 1.1, 1.5]


def update_actor(base: list[float], run: list[float] | float, **hardware: Any) -> Any:
    """The update_actor time row of ``run`` seconds against ``base`` seconds."""
    changes = {"hardware": hardware} if hardware else {}
    baseline = record("local-ci", phases={"update_actor": {"seconds": base}}, **changes)
    return by_metric(compare(record(phases={"update_actor": {"seconds": run}}, **changes), baseline))[
        "timing_s/update_actor"
    ]


def test_a_difference_past_tolerance_must_also_be_real_by_the_rank_test() -> None:
    # median 1.25 > 1.05 x 1.1, but the rounds interleave: one-sided Mann-Whitney p = 31/252 = 0.12
    row = update_actor(BASE_ROUNDS, [1.0, 1.2, 1.25, 1.3, 1.6])
    assert (row.verdict, row.reason) == ("pass", "not significant")
    assert "(p = 0.12 >= 0.01, 5 vs 5 rounds)" in row.message
    # every run round above every baseline round but the baseline's outlier: p = 19/252 = 0.075
    row = update_actor(BASE_ROUNDS, [1.3, 1.32, 1.34, 1.36, 1.4])
    assert (row.verdict, row.reason) == ("pass", "not significant")
    # all five above all five: p = 1/252 = 0.004 < 0.01
    row = update_actor(BASE_ROUNDS, [1.6, 1.62, 1.64, 1.66, 1.7])
    assert (row.verdict, row.reason) == ("fail", "slower")
    assert "slower (p = 0.004 < 0.01, 5 vs 5 rounds); tokens/s per GPU 48.78" in row.message
    # throughputs the other way round: the run's rounds all below the baseline's
    base = record("local-ci", phases={"update_actor": {"seconds": BASE_ROUNDS}})
    baseline = compare(record(phases={"update_actor": {"seconds": [1.6, 1.62, 1.64, 1.66, 1.7]}}), base)
    assert [c.metric for c in baseline.failures] == ["timing_s/update_actor"]


def test_too_few_rounds_to_reach_the_level_is_inconclusive_and_not_a_failure() -> None:
    # 4 vs 4 rounds, fully separated: the smallest p they can give is 1/70 = 0.014 >= 0.01
    row = update_actor([0.9, 1.0, 1.05, 1.1], [1.6, 1.62, 1.64, 1.66])
    assert (row.verdict, row.reason) == ("inconclusive", "too few rounds")
    assert "(4 vs 4 rounds cannot reach p < 0.01; 5 rounds per side can)" in row.message
    assert "slower" not in row.message


def test_one_figure_on_a_side_leaves_the_threshold_to_decide_and_says_so() -> None:
    row = update_actor(BASE_ROUNDS, 1.225)
    assert (row.verdict, row.reason) == ("fail", "slower")
    assert "rests on one figure: the run has a single value" in row.message
    assert "slower (rests on one figure: the baseline has a single value, so no rank test)" in update_actor(
        [1.0], [1.2, 1.21, 1.22]
    ).message


CPU = {"device": "cpu", "gpus_per_node": None, "gpu_model": None, "cpu_model": "x86", "cpus_per_node": 2}


def test_a_difference_below_the_noise_floor_cannot_fail_and_the_verdict_says_the_floor() -> None:
    # 0.3 ms -> 0.5 ms on a CPU: ratio 1.67, every round slower, but 0.2 ms is below the 10 ms floor
    row = update_actor([0.0003, 0.00031, 0.00032, 0.00033, 0.00034], [0.0005, 0.00051, 0.00052, 0.00053, 0.00054], **CPU)
    assert (row.verdict, row.reason) == ("pass", "below the noise floor")
    assert "(a difference of 0.2 ms in time, at most the 10 ms floor on CPU)" in row.message
    # 20 ms slower is past the CPU floor and the GPU's (10 ms); 5 ms slower is past neither
    slow = [0.05, 0.051, 0.052, 0.053, 0.054]
    assert update_actor([0.03, 0.031, 0.032, 0.033, 0.034], slow, **CPU).verdict == "fail"
    assert update_actor([0.03, 0.031, 0.032, 0.033, 0.034], slow).verdict == "fail"
    row = update_actor([0.0030, 0.0031, 0.0032, 0.0033, 0.0034], [0.008, 0.0081, 0.0082, 0.0083, 0.0084])
    assert row.reason == "below the noise floor", row.message
    assert "at most the 10 ms floor on GPU" in row.message


def test_time_gap_of_a_figure() -> None:
    # a time 1.25x: 2.5 s now, 2.0 s in the baseline; a throughput at 0.8x: the same half second
    assert time_gap_s(2.5, 1.25, higher_is_better=False) == pytest.approx(0.5)
    assert time_gap_s(2.5, 0.8, higher_is_better=True) == pytest.approx(0.5)


def test_a_phase_the_session_did_not_run_is_not_run_and_a_metric_its_phase_lacks_fails() -> None:
    base = record("local-ci", phases={**BASE["phases"], "ref": {"seconds": 0.5}})
    result = compare(record(), base)
    row = by_metric(result)["timing_s/ref"]
    assert (row.verdict, row.reason, row.measured) == ("not run", "not run", None)
    assert row.message == "ref seconds: not run in this session; baseline 'local-ci' has 0.500 s"
    assert result.passed and row not in result.failures
    # a throughput the run cannot compute (no token counts) although its phase ran is missing: a failure
    no_tokens = record(tokens={"prompt_lengths": None, "response_lengths": None})
    row = by_metric(compare(no_tokens, record("local-ci")))["tokens_per_s_per_gpu/gen"]
    assert (row.verdict, row.reason) == ("fail", "missing")
    # a custom metric has no phase: missing from the run, it fails
    custom = record("local-ci", metrics={"peak_memory_gb": {"value": 10.0, "unit": "GB", "higher_is_better": False}})
    assert by_metric(compare(record(), custom))["peak_memory_gb"].verdict == "fail"
    assert "response token counts not recorded" in row.message


def test_per_metric_tolerance_from_the_baseline_file() -> None:
    slow = record(phases={**BASE["phases"], "update_actor": {"seconds": 1.32}})
    exact = record("local-ci", tolerances={"timing_s/update_actor": 0.5})
    row = by_metric(compare(slow, exact))["timing_s/update_actor"]
    assert (row.verdict, row.tolerance) == ("pass", 0.5)
    assert by_metric(compare(slow, exact))["tokens_per_s_per_gpu/update_actor"].tolerance == 0.10
    family = record("local-ci", tolerances={"timing_s": 0.4, "timing_s/gen": 0.01})
    assert tolerance_for("timing_s/update_actor", family, 0.1) == 0.4
    assert tolerance_for("timing_s/gen", family, 0.1) == 0.01  # the exact id wins over the family
    assert tolerance_for("mfu/ref", family, 0.1) == 0.1
    assert by_metric(compare(slow, record("local-ci"), tolerance=0.5))["timing_s/update_actor"].verdict == "pass"


def test_custom_metrics_are_gated_in_their_direction() -> None:
    base = record("local-ci", metrics={"peak_memory_gb": {"value": 10.0, "unit": "GB", "higher_is_better": False}})
    more = record(metrics={"peak_memory_gb": {"value": 12.0, "unit": "GB", "higher_is_better": False}})
    row = by_metric(compare(more, base))["peak_memory_gb"]
    assert (row.verdict, row.reason) == ("fail", "higher")
    assert row.message.startswith("peak_memory_gb: 12.00 GB vs 10.00 GB in baseline 'local-ci'")


def test_cpu_runs_gate_on_cpu_model_and_count() -> None:
    cpu = {"device": "cpu", "gpus_per_node": None, "gpu_model": None, "cpu_model": "AMD EPYC 9654", "cpus_per_node": 16}
    assert compare(record(hardware=cpu), record("local-ci", hardware=cpu)).mode == "gate"
    other = {**cpu, "cpus_per_node": 32}
    result = compare(record(hardware=cpu), record("local-ci", hardware=other))
    assert result.mismatches == ("hardware.cpus_per_node: run 16, baseline 32",)


def gpu_row(phase: str, base: list[float], run: list[float], tolerance: float) -> Any:
    """The time row of ``phase`` judged on a GPU at ``tolerance`` (a DefaultTolerance: nobody chose it)."""
    baseline = record("local-ci", phases={phase: {"seconds": base}})
    return by_metric(compare(record(phases={phase: {"seconds": run}}), baseline, tolerance))[f"timing_s/{phase}"]


def test_a_gpu_phase_nobody_chose_a_tolerance_for_is_judged_at_its_measured_one() -> None:
    base = [3.00, 3.01, 3.02, 3.03, 3.04]
    slower = [t * 1.05 for t in base]  # 5% slower, every round
    gen = gpu_row("gen", base, slower, default_tolerance(gpu=True))
    assert (gen.verdict, gen.tolerance) == ("fail", GPU_PHASE_TOLERANCES["gen"]), gen.message
    assert f"tolerance {GPU_PHASE_TOLERANCES['gen']:.2f}, gen's measured GPU default" in gen.message
    update = gpu_row("update_actor", base, slower, default_tolerance(gpu=True))
    assert (update.verdict, update.tolerance) == ("pass", GPU_PHASE_TOLERANCES["update_actor"]), update.message
    # a tolerance someone chose wins, and a phase without a measured one keeps the default
    assert gpu_row("gen", base, slower, 0.10).verdict == "pass"
    assert gpu_row("reshard", base, slower, default_tolerance(gpu=True)).tolerance == DEFAULT_TOLERANCE


def test_a_short_gpu_phase_failing_its_measured_tolerance_says_it_waits_on_the_host() -> None:
    """A tiny model's GPU phases (tens of ms) failed unchanged code at the tolerances measured on phases
    of about 1 s: such a failure names the rounds' length and what to do; a long phase's does not, nor
    one judged at a tolerance someone chose. The verdict itself is not changed."""
    short = [0.040, 0.041, 0.042, 0.043, 0.044]
    row = gpu_row("old_log_prob", short, [t * 1.5 for t in short], default_tolerance(gpu=True))
    assert row.verdict == "fail", row.message
    assert "its rounds (42 ms) are shorter than any this GPU tolerance was measured on (about 1 s)" in row.message
    assert "--rl-tolerance" in row.message
    long = [3.00, 3.01, 3.02, 3.03, 3.04]
    slow_long = gpu_row("gen", long, [t * 1.05 for t in long], default_tolerance(gpu=True))
    assert slow_long.verdict == "fail" and "shorter than any" not in slow_long.message, slow_long.message
    chosen = gpu_row("old_log_prob", short, [t * 1.5 for t in short], 0.08)
    assert chosen.verdict == "fail" and "shorter than any" not in chosen.message, chosen.message


def test_a_gpu_baseline_saved_on_the_machine_that_runs_the_gate_is_judged_at_the_one_machine_tolerance() -> None:
    base = [3.00, 3.01, 3.02, 3.03, 3.04]
    slower = [t * 1.10 for t in base]  # 10%: past update_actor's one-machine tolerance, within its across-machines one
    here, there = {"machine": "gpus 1a2b3c4d5e6f, driver 580.82.07"}, {"machine": "gpus 9f8e7d6c5b4a, driver 580.82.07"}

    def row(run_hw: dict, base_hw: dict) -> Any:
        baseline = record("local-ci", phases={"update_actor": {"seconds": base}}, hardware=base_hw)
        run = record(phases={"update_actor": {"seconds": slower}}, hardware=run_hw)
        return by_metric(compare(run, baseline, default_tolerance(gpu=True)))["timing_s/update_actor"]

    same, other, unknown = row(here, here), row(here, there), row(here, {})
    assert GPU_SAME_MACHINE_TOLERANCES["update_actor"] < 0.10 < GPU_PHASE_TOLERANCES["update_actor"]
    assert (same.verdict, same.tolerance) == ("fail", GPU_SAME_MACHINE_TOLERANCES["update_actor"]), same.message
    assert "update_actor's measured GPU default on one machine" in same.message, same.message
    for across in (other, unknown):  # a baseline that names no machine is read as from another one
        assert (across.verdict, across.tolerance) == ("pass", GPU_PHASE_TOLERANCES["update_actor"]), across.message


def test_the_short_verdict_line_says_the_tolerance_was_the_phases_measured_one() -> None:
    from pytest_rlbench.reports.verdict_lines import short_verdict

    base = [3.00, 3.01, 3.02, 3.03, 3.04]
    row = gpu_row("gen", base, [t * 1.05 for t in base], default_tolerance(gpu=True))
    assert row.tolerance_source == "gen's measured GPU default"
    assert f"1.05x > {1 + GPU_PHASE_TOLERANCES['gen']:.2f} (measured)" in short_verdict(row), short_verdict(row)
    chosen = gpu_row("gen", base, [t * 1.05 for t in base], 0.03)  # chosen: no source, no tag
    assert chosen.tolerance_source == "" and "(measured)" not in short_verdict(chosen)


def test_a_gpu_gate_says_which_machine_each_side_ran_on() -> None:
    from pytest_rlbench.reports.terminal import comparison_lines

    a, b = "gpus 1a2b3c4d5e6f, driver 580.82.07", "gpus 9f8e7d6c5b4a, driver 580.82.07"
    other = compare(record(hardware={"machine": a}), record("base", hardware={"machine": b}))
    assert other.mode == "gate", other.mismatches  # a machine of the same kind gates: never a mismatch
    assert other.machines == f"another machine of this kind: this run {a}; the baseline {b}"
    assert comparison_lines(other)[1] == f"  on {other.machines}"
    same = compare(record(hardware={"machine": a}), record("base", hardware={"machine": a}))
    assert same.machines == f"the same machine as the baseline ({a})"
    # a record without it (a CPU run, an older baseline) says nothing of machines
    assert compare(record(hardware={"machine": a}), record("base")).machines == ""


def test_a_save_that_wrote_other_bytes_is_listed_not_judged_on_the_same_machine() -> None:
    """Same machine, same work otherwise: a save whose checkpoint changed size (a state left out, or
    another dtype) is other work, so its time is listed, not judged, and says why; the same bytes
    are judged as any phase."""
    def saved(name: str, written: float, seconds: float) -> RunRecord:
        timed = {"save_checkpoint": {"seconds": [seconds] * 5}}
        return record(name, phases=timed, metrics={"checkpoint/bytes": {"value": written, "unit": "B", "higher_is_better": False}})

    base = saved("local-ci", 1e9, 1.0)
    half = compare(saved("run", 0.5e9, 0.6), base)
    row = by_metric(half)["timing_s/save_checkpoint"]
    assert row.verdict == "reference" and "not judged: the saves are other work (bytes per GPU" in row.message, row.message
    same = compare(saved("run", 1e9, 2.0), base)
    assert by_metric(same)["timing_s/save_checkpoint"].verdict == "fail"
    # a save whose bytes this run could not read (another framework's save): its time is judged alone
    unread = compare(record("run", phases={"save_checkpoint": {"seconds": [1.0] * 5}}), base)
    assert by_metric(unread)["timing_s/save_checkpoint"].verdict == "pass" and unread.passed
    assert "checkpoint_gb_per_s_per_gpu/save_checkpoint" not in by_metric(unread)
