"""A published baseline's assumed GPU model is listed once among a gate's assumptions: where the
workload assumes it (verl-7b: "8 nodes x 8 GPUs") and the gate reads it further (its variant, for the
efficiency gate's peak bandwidth; the run's name, for the per-GPU gate), one line says both."""

from __future__ import annotations

import pytest
from replay_records import H100, H200, replay_record

from pytest_rlbench.records.baselines import load_baseline
from pytest_rlbench.records.workload_format import assumptions
from pytest_rlbench.verdict.compare import compare
from pytest_rlbench.verdict.gate_basis import EFFICIENCY, PER_GPU, hardware_assumptions, with_assumed_gpu

SEVEN = load_baseline("verl-7b")
ASSUMED = f"hardware.gpu_model = 'H100' ({SEVEN.workload.gpu_model.why})"


@pytest.mark.parametrize(
    ("gpu", "basis", "reading"),
    [
        (H200, EFFICIENCY, "taken as 'H100 SXM' for its peak memory bandwidth"),
        (H100, PER_GPU, f"read as the run's {H100!r} (its variant is not stated)"),
    ],
    ids=["h200-efficiency", "h100-per-gpu"],
)
def test_the_assumed_gpu_is_listed_once_with_how_the_gate_reads_it(
    gpu: str, basis: str, reading: str
) -> None:
    assert SEVEN.hardware.gpu_model is None and SEVEN.workload.gpu_model.source == "assumed"
    run = replay_record(SEVEN, gpu, world_size=4, speedup=1.0)
    result = compare(run, SEVEN)
    assert (result.mode, result.basis) == ("gate", basis)
    gpu_lines = [a for a in result.assumptions if "gpu_model" in a or "H100" in a]
    assert gpu_lines == [f"{ASSUMED}, {reading}"], result.assumptions
    # the verdicts' note names it once too
    note = next(c.message for c in result.comparisons if "assumed value(s)" in c.message)
    names = note.split("assumed value(s): ", 1)[1].split(";", 1)[0].split(", ")
    assert names.count("hardware.gpu_model") == 1 and "gpu_model" not in names, names
    assert f"rests on {len(result.assumptions)} assumed value(s)" in note


def test_the_workload_leaves_the_gpu_model_to_the_hardware_reading() -> None:
    # The lines compare joins: the hardware's readings, then the workload's other assumed values.
    assumed = with_assumed_gpu(SEVEN)
    run = replay_record(SEVEN, H200, world_size=4, speedup=1.0)
    hardware = hardware_assumptions(run, assumed, EFFICIENCY)[1]
    workload = assumptions(assumed.workload)
    assert hardware[0].startswith(ASSUMED) and not any("gpu_model" in a for a in workload), workload
    assert "dtype = 'bfloat16' (VERL's compute default; the source does not state it)" in workload
