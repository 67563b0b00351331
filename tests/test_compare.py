"""The comparison gate: gate or reference, thresholds, noise, missing metrics, tolerances."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pytest_rlbench.baselines import load_baseline
from pytest_rlbench.compare import compare, gate_mismatches, outside_noise, tolerance_for
from pytest_rlbench.record import RunRecord, record_from_dict

BASE: dict[str, Any] = {
    "format_version": 1,
    "name": "local-ci",
    "provenance": {"source": "pytest-rlbench run"},
    "hardware": {"device": "gpu", "nodes": 1, "gpus_per_node": 1, "world_size": 1, "gpu_model": "NVIDIA H100 80GB HBM3"},
    "model": {
        "name": "tiny",
        "num_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 16,
        "vocab_size": 100,
    },
    "config": {"train_batch_size": 2, "rollout_n": 2, "max_prompt_length": 8, "max_response_length": 16},
    "tokens": {"prompt_lengths": [4, 4, 4, 4], "response_lengths": [16, 16, 16, 16], "decode_steps": 16},
    "phases": {"gen": {"seconds": 2.0}, "update_actor": {"seconds": 1.0}, "step": {"seconds": 4.0}},
}


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
    assert {c.verdict for c in result.comparisons} == {"pass"}
    # times and throughputs the baseline has; efficiency figures are not gated
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
    assert row.message == "update_actor seconds: 1.32 s vs 1.00 s in baseline 'local-ci' (ratio 1.32, tolerance 0.10): slower"
    throughput = by_metric(result)["tokens_per_s_per_gpu/update_actor"]
    assert (throughput.verdict, throughput.reason) == ("fail", "lower")
    assert not result.passed
    assert {c.metric for c in result.failures} == {"timing_s/update_actor", "tokens_per_s_per_gpu/update_actor"}


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


def test_a_difference_inside_the_noise_passes() -> None:
    base = record("local-ci", phases={"update_actor": {"seconds": [0.9, 1.0, 1.1, 1.5]}})
    # median 1.225 > 1.05 x 1.1, but the run's lower quartile 1.15 is below the baseline's upper quartile 1.2
    noisy = record(phases={"update_actor": {"seconds": [1.0, 1.2, 1.25, 1.6]}})
    row = by_metric(compare(noisy, base))["timing_s/update_actor"]
    assert (row.verdict, row.reason) == ("pass", "inside noise")
    clear = record(phases={"update_actor": {"seconds": [1.3, 1.32, 1.34, 1.36]}})
    row = by_metric(compare(clear, base))["timing_s/update_actor"]
    assert (row.verdict, row.reason) == ("fail", "slower")
    # one sample on a side: no noise estimate, the threshold alone decides
    single = record(phases={"update_actor": {"seconds": 1.225}})
    assert by_metric(compare(single, base))["timing_s/update_actor"].verdict == "fail"


def test_outside_noise_rule() -> None:
    assert outside_noise([1.3, 1.4], [1.0, 1.1], higher_is_better=False)
    assert not outside_noise([1.0, 1.3], [1.0, 1.2], higher_is_better=False)
    assert outside_noise([90.0, 91.0], [100.0, 101.0], higher_is_better=True)
    assert not outside_noise([95.0, 105.0], [100.0, 101.0], higher_is_better=True)
    assert outside_noise([5.0], [1.0, 2.0], higher_is_better=False)


def test_a_metric_the_baseline_has_and_the_run_lacks_fails() -> None:
    base = record("local-ci", phases={**BASE["phases"], "ref": {"seconds": 0.5}})
    row = by_metric(compare(record(), base))["timing_s/ref"]
    assert (row.verdict, row.reason, row.measured) == ("fail", "missing", None)
    assert "ref seconds: missing from this run" in row.message and "'local-ci'" in row.message
    # a throughput the run cannot compute (no token counts) is missing too
    no_tokens = record(tokens={"prompt_lengths": None, "response_lengths": None})
    row = by_metric(compare(no_tokens, record("local-ci")))["tokens_per_s_per_gpu/gen"]
    assert (row.verdict, row.reason) == ("fail", "missing")
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
