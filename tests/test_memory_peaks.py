"""Each phase's peak GPU memory: the trainer's step figures (trainer/workers/memory_peaks.py) and the
plugin's recording of them as run metrics that no verdict judges."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from shared_parts import assert_judged_none_of, step_recorder

from pytest_rlbench.records.metrics import step_evidence_unit
from pytest_rlbench.reports.answer import memory_line
from trainer.workers.memory_peaks import GIB, PhasePeaks, largest_worker, worker_figures

pytestmark = pytest.mark.usefixtures("plugin_deps_loaded")  # see tests/conftest.py



def test_a_phase_figure_is_the_worker_that_held_the_most_in_gib() -> None:
    one = worker_figures({"update_actor": (3 * GIB, 6 * GIB), "generate_sequences": (GIB, 2 * GIB)})
    two = worker_figures({"update_actor": (5 * GIB, int(5.5 * GIB))})
    assert one["gpu/max_allocated_gib/update_actor"] == 3.0 and one["gpu/max_reserved_gib/update_actor"] == 6.0
    # per phase, both figures of the one GPU that held the most: 5/5.5, not 5 with the other's 6
    assert largest_worker([{**one, "actor/pg_loss": 0.1}, two]) == {
        "gpu/max_allocated_gib/update_actor": 5.0,
        "gpu/max_reserved_gib/update_actor": 5.5,
        "gpu/max_allocated_gib/generate_sequences": 1.0,
        "gpu/max_reserved_gib/generate_sequences": 2.0,
    }
    assert worker_figures({}) == {} and largest_worker([{"actor/pg_loss": 0.1}, {}]) == {}  # CPU workers


def test_the_plugin_records_the_trainers_figures_and_no_verdict_judges_them(tmp_path: Path) -> None:
    figures = worker_figures({"update_actor": (3 * GIB, 4 * GIB), "reshard": (GIB, GIB)})
    assert all(step_evidence_unit(name) == "GiB" for name in figures)  # the names the trainer gives
    assert step_evidence_unit("gpu/max_allocated_gib/not_a_phase") is None
    assert step_evidence_unit("gpu/power_w/update_actor") is None  # NVML's figures are recorded elsewhere

    def record(name: str, scale: float):
        recorder = step_recorder(name, tmp_path / name)
        rounds = [{**{k: v * scale * (1 + i / 10) for k, v in figures.items()}, "critic/score/mean": 0.5} for i in range(5)]
        recorder.add_step_metrics(rounds)
        return recorder.build_record()

    run, base = record("run", 2.0), record("base", 1.0)
    assert set(run.metrics) == set(figures)
    assert run.metrics["gpu/max_allocated_gib/update_actor"].value == pytest.approx([6.0, 6.6, 7.2, 7.8, 8.4])
    assert run.metrics["gpu/max_allocated_gib/update_actor"].unit == "GiB"
    # twice the memory is evidence beside the verdict, not a failure
    assert_judged_none_of(run, base, "gpu")
    # the summary's line, in the phases' order: the largest round, what must fit
    assert memory_line(run) == [
        "peak GPU memory per GPU (largest round), GiB allocated/reserved: reshard 2.8/2.8, update_actor 8.4/11.2"
    ]
    assert memory_line(dataclasses.replace(run, metrics={})) == []


def test_a_cpu_worker_records_no_peak() -> None:
    peaks = PhasePeaks(torch.device("cpu"))
    with peaks.phase("update_actor"):
        torch.zeros(1024)
    assert peaks.take() == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_gpu_phase_peak_holds_what_it_allocated_and_is_taken_once() -> None:
    device = torch.device("cuda", 0)
    peaks = PhasePeaks(device)
    before = torch.cuda.memory_allocated(device)  # what earlier tests of this process still hold
    held = torch.empty(8 * 2**20, dtype=torch.uint8, device=device)  # held through both phases
    with peaks.phase("old_log_prob"):
        scratch = torch.empty(64 * 2**20, dtype=torch.uint8, device=device)
        del scratch
    with peaks.phase("ref"):
        pass
    taken = peaks.take()
    allocated, reserved = taken["old_log_prob"]
    assert allocated - before >= 72 * 2**20 and reserved >= allocated, (before, taken)  # the scratch and what was held
    assert 8 * 2**20 <= taken["ref"][0] - before < 64 * 2**20, (before, taken)  # the peak restarted from what was held
    assert peaks.take() == {}
    del held
