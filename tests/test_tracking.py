"""trainer.driver.tracking: the console line and TensorBoard scalars (trainer.logger)."""

from __future__ import annotations

import io

from trainer.driver.tracking import Tracking, format_console


def test_console_puts_the_seed_timing_keys_first_in_the_seed_order():
    line = format_console(
        3, {"actor/pg_loss": 0.5, "timing_s/step": 2.0, "timing_s/gen": 1.25, "timing_s/reward": 0.125}
    )
    assert line == "step:3 - timing_s/gen:1.250 - timing_s/reward:0.125 - timing_s/step:2.000 - actor/pg_loss:0.5"


def test_tensorboard_writes_scalars_that_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = io.StringIO()
    tracking = Tracking(["console", "tensorboard"], tmp_path, stream=out)
    tracking.log(1, {"timing_s/gen": 1.5, "critic/score/mean": 0.25})
    tracking.log(2, {"timing_s/gen": 1.0, "critic/score/mean": 0.5})
    tracking.close()
    assert out.getvalue().count("step:") == 2
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    gen = [(e.step, e.value) for e in events.Scalars("timing_s/gen")]
    assert gen == [(1, 1.5), (2, 1.0)]
