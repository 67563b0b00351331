"""Rounds of a callable timed by hand on the device-drained clock (``trainer.timing.device_clock``),
where pytest-benchmark does not time them: ``rl_bench`` under ``--benchmark-disable``, the rollout
panel's engines, and a gate's second timing of its phase (``pytest_rlbench.verdict.retiming``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytest_rlbench.session.progress import Stage, round_label


def time_rounds(
    fn: Callable[[], Any],
    warmup: int,
    rounds: int,
    stage: Stage,
    before_round: Callable[[], Any] | None = None,
) -> tuple[list[float], list[Any]]:
    """Each timed round's seconds after ``warmup`` untimed rounds, and every round's result (warm-up
    rounds first). ``before_round`` runs ahead of each round, outside its time; the device is drained
    before the clock starts."""
    from trainer.timing import device_clock

    samples: list[float] = []
    results: list[Any] = []
    for index in range(warmup + rounds):
        stage.step(round_label(index, warmup, rounds))
        if before_round is not None:
            before_round()
        start = device_clock()
        results.append(fn())
        if index >= warmup:
            samples.append(device_clock() - start)
        stage.done()
    return samples, results
