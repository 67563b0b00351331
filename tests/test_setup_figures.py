"""What a worker's set-up spends outside every phase (the rollout engine's and the training phases'
warm-ups, pinning host memory):
recorded as run metrics from the workers' set-up reports, shown in the summary, never judged."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from shared_parts import assert_judged_none_of, step_recorder

from pytest_rlbench.records.metrics import setup_figures
from pytest_rlbench.reports.answer import setup_line
from pytest_rlbench.session.recorder import BenchRecorder

pytestmark = pytest.mark.usefixtures("plugin_deps_loaded")  # see tests/conftest.py


def test_the_slowest_worker_gives_each_figure_and_workers_that_spent_none_give_none() -> None:
    workers = [
        {"rank": 0, "rollout_warm_up_s": 3.5, "training_warm_up_s": 2.5, "row_plans_s": 0.0, "pinning_s": 0.0},
        {"rank": 1, "rollout_warm_up_s": 4.25, "training_warm_up_s": 1.75, "row_plans_s": 0.0, "pinning_s": 0.0},
        {"rank": 2},  # a trainer whose workers report none
    ]
    # no row long enough to attend alone: no plans built, and none named
    assert setup_figures(workers) == {"setup_s/rollout_warm_up": 4.25, "setup_s/training_warm_up": 2.5}
    assert setup_figures([{"row_plans_s": 9.25}, {"row_plans_s": 8.5}]) == {"setup_s/row_plans": 9.25}
    assert setup_figures([{"rollout_warm_up_s": 0.0, "pinning_s": 37.8}]) == {"setup_s/pinning": 37.8}
    assert setup_figures([{"rollout_warm_up_s": 0.0, "pinning_s": 0.0}, {}]) == {}  # CPU workers


def test_set_up_seconds_are_shown_and_never_judged(tmp_path: Path) -> None:
    def record(name: str, setup: dict[str, float]):
        recorder = step_recorder(name, tmp_path / name)
        for metric, seconds in setup.items():
            recorder.add_metric(metric, [seconds], "s", higher_is_better=False)
        return recorder.build_record()

    run = record("run", {"setup_s/rollout_warm_up": 9.9, "setup_s/training_warm_up": 4.2, "setup_s/row_plans": 9.2,
                         "setup_s/pinning": 37.8})
    base = record("base", {"setup_s/rollout_warm_up": 1.0, "setup_s/training_warm_up": 0.1, "setup_s/row_plans": 0.5,
                           "setup_s/pinning": 1.0})
    assert_judged_none_of(run, base, "setup_s")  # ten and thirty times the set-up
    assert setup_line(run) == [
        "set-up, outside every timed phase: rollout warm-up 9.9 s (its kernels compiled before the first gen, "
        "as vLLM's are when it starts); training warm-up 4.2 s (old_log_prob's, ref's and update_actor's kernels "
        "compiled before their first call); cuDNN's attention plans for long packed rows built in 9.2 s (one for "
        "each width a row attending alone can take); host memory pinned for the optimizer state in 37.8 s"
    ]
    without_plans = dataclasses.replace(run, metrics={k: v for k, v in run.metrics.items() if k != "setup_s/row_plans"})
    assert "cuDNN" not in setup_line(without_plans)[0]  # none built: none named
    assert setup_line(dataclasses.replace(run, metrics={})) == []


def test_set_up_seconds_alone_are_not_a_measurement(tmp_path: Path) -> None:
    """A session that built a GPU trainer but timed nothing writes no report (nor a baseline of nothing)."""
    recorder = BenchRecorder("run", tmp_path)
    recorder.add_setup_figures([{"rollout_warm_up_s": 3.6, "pinning_s": 37.8}, {"rollout_warm_up_s": 3.1}])
    assert recorder.metrics["setup_s/rollout_warm_up"].value == [3.6]
    assert recorder.metrics["setup_s/pinning"].value == [37.8]
    assert not recorder.measured_anything
    recorder.record("step", [1.0] * 5, "t::step")
    assert recorder.measured_anything
