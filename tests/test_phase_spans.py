"""A phase's time outside its workers' own calls: the workers' spans against the driver's
(trainer/workers/phase_spans.py), and the plugin's recording of them as evidence no verdict judges."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from shared_parts import assert_judged_none_of, step_recorder

from pytest_rlbench.records.metrics import step_evidence_unit
from pytest_rlbench.reports.answer import waits_line
from trainer.workers.phase_spans import PhaseSpans, span_figures, wait_figures, worker_spans

pytestmark = pytest.mark.usefixtures("plugin_deps_loaded")  # see tests/conftest.py


def test_the_figures_are_the_last_start_the_spread_of_ends_and_the_way_back() -> None:
    driver = {"old_log_prob": (100.0, 110.0), "step": (90.0, 130.0)}
    workers = [{"old_log_prob": (100.5, 108.0)}, {"old_log_prob": (101.0, 109.5)}]
    # binary-exact values: the figures are plain differences
    assert wait_figures(driver, workers) == {
        "workers/start_lag_s/old_log_prob": 1.0,  # the last worker started a second after the driver
        "workers/end_spread_s/old_log_prob": 1.5,  # one worker ended 1.5 s before the other
        "workers/collect_s/old_log_prob": 0.5,  # the driver held both results half a second after
    }
    # a phase that a worker did not run (the step, the driver's own) has no figures; no workers, none
    assert wait_figures(driver, [{"old_log_prob": (100.5, 108.0)}, {}]) == {}
    assert wait_figures(driver, []) == {}


def test_a_workers_spans_ride_with_its_figures_and_come_apart_again() -> None:
    spans = PhaseSpans()
    before = time.time()
    with spans.phase("ref"):
        pass
    with pytest.raises(RuntimeError), spans.phase("update_actor"):  # a failed call keeps its span
        raise RuntimeError("boom")
    taken = spans.take()
    assert set(taken) == {"ref", "update_actor"} and spans.take() == {}
    assert before <= taken["ref"][0] <= taken["ref"][1] <= taken["update_actor"][0] <= taken["update_actor"][1]
    figures = {"actor/pg_loss": 0.25, **span_figures(taken)}
    assert worker_spans(figures) == (taken, {"actor/pg_loss": 0.25})


def test_the_plugin_records_the_figures_and_no_verdict_judges_them(tmp_path: Path) -> None:
    figures = wait_figures(
        {"old_log_prob": (0.0, 10.0), "update_actor": (20.0, 40.0)},
        [{"old_log_prob": (0.25, 9.0), "update_actor": (20.0, 39.0)}, {"old_log_prob": (0.5, 9.5), "update_actor": (20.0, 39.0)}],
    )
    assert all(step_evidence_unit(name) == "s" for name in figures)
    assert step_evidence_unit("workers/start_lag_s/not_a_phase") is None and step_evidence_unit("workers/other/ref") is None

    def record(name: str, scale: float):
        recorder = step_recorder(name, tmp_path / name)
        rounds = [{k: v * scale * (1 + i) for k, v in figures.items()} for i in range(3)]
        recorder.add_step_metrics(rounds)
        return recorder.build_record()

    run, base = record("run", 4.0), record("base", 1.0)
    assert set(run.metrics) == set(figures)
    assert run.metrics["workers/start_lag_s/old_log_prob"].value == pytest.approx([2.0, 4.0, 6.0])
    assert_judged_none_of(run, base, "workers")  # four times the waits: evidence beside the verdict, not a failure
    # each figure the most of any round (the third, x 3 x 4)
    assert waits_line(run) == [
        "around the workers' calls (whole steps; seconds, the most of any round): "
        "old_log_prob 6.00 until the last worker began + 6.00 after the last ended, workers' ends 6.00 apart; "
        "update_actor 0.00 until the last worker began + 12.00 after the last ended, workers' ends 0.00 apart"
    ]
    tiny = record("tiny", 0.005)  # under 0.1 s in all: nothing worth a line
    assert waits_line(tiny) == [] and waits_line(dataclasses.replace(run, metrics={})) == []
    # workers that end apart are named though the driver adds little: uneven work shows
    uneven = wait_figures({"generate_sequences": (0.0, 10.0)}, [{"generate_sequences": (0.0, 7.5)}, {"generate_sequences": (0.0, 10.0)}])
    recorder = step_recorder("uneven", tmp_path / "uneven")
    recorder.add_step_metrics([uneven])
    assert waits_line(recorder.build_record()) == [
        "around the workers' calls (whole steps; seconds, the most of any round): "
        "generate_sequences 0.00 until the last worker began + 0.00 after the last ended, workers' ends 2.50 apart"
    ]
