"""When each worker ran each phase, against the driver's span of it: where a phase on several workers
spends time outside any worker's own work.

The driver times a phase from before it sends the workers their parts until it holds all their
results (trainer/timing.py). A worker records its own span of the call: from when it starts on its
part until it returns. Against the driver's span, per phase:

- ``start_lag_s``: the last worker's start after the driver's: the driver preparing the parts
  (sharding, selecting rows), sending them (serialised one worker after another) and Ray scheduling
  the call;
- ``collect_s``: the driver's end after the last worker's: the results' way back and the driver
  assembling them;
- ``end_spread_s``: the last worker's end after the first's: uneven work, or one GPU slower than
  another (where no collective holds the workers together at the end). Not a term of the phase's
  time, which is start_lag_s + the last worker's end less its start + collect_s.

Whole steps only (GRPOTrainer.train_step): a phase benchmarked apart records none. A phase timed twice
in one step keeps its last call's spans.

Spans are wall-clock (``time.time()``), so they compare across the processes of one host exactly and
across hosts to within their clocks' agreement. A worker's spans ride back with update_actor's figures
(``span_figures``), as its peak memory does (memory_peaks.py); the driver reads them with
``worker_spans`` and turns them into the step's figures ``workers/<figure>/<phase>`` (``wait_figures``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

WORKERS = "workers"  # the step figures' family: evidence beside the verdicts, never judged
START_LAG = "start_lag_s"
END_SPREAD = "end_spread_s"
COLLECT = "collect_s"
WAIT_FIGURES: tuple[str, ...] = (START_LAG, END_SPREAD, COLLECT)
_SPAN = "worker_span"  # a worker's raw figures: worker_span/start/<phase>, worker_span/end/<phase>

Span = tuple[float, float]  # (start, end), seconds since the epoch


class PhaseSpans:
    """The spans of the phases a worker ran since they were last taken."""

    def __init__(self) -> None:
        self.spans: dict[str, Span] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.time()
        try:
            yield
        finally:
            self.spans[name] = (start, time.time())

    def take(self) -> dict[str, Span]:
        taken, self.spans = self.spans, {}
        return taken


def span_figures(spans: Mapping[str, Span]) -> dict[str, float]:
    """One worker's spans as figures that ride back with its others."""
    out: dict[str, float] = {}
    for phase, (start, end) in spans.items():
        out[f"{_SPAN}/start/{phase}"] = start
        out[f"{_SPAN}/end/{phase}"] = end
    return out


def worker_spans(figures: Mapping[str, float]) -> tuple[dict[str, Span], dict[str, float]]:
    """A worker's figures split into its spans and the rest."""
    spans: dict[str, Span] = {}
    rest: dict[str, float] = {}
    for key, value in figures.items():
        family, edge, phase = (key.split("/", 2) + ["", ""])[:3]
        if family != _SPAN:
            rest[key] = value
        elif edge == "start":
            spans[phase] = (value, figures[f"{_SPAN}/end/{phase}"])
    return spans, rest


def wait_figures(driver: Mapping[str, Span], workers: Sequence[Mapping[str, Span]]) -> dict[str, float]:
    """``workers/<figure>/<phase>`` for each phase that the driver timed and every worker ran: seconds
    (module docstring). A lag below 0 (clocks of two hosts that disagree) is kept as measured."""
    out: dict[str, float] = {}
    for phase, (start, end) in driver.items():
        if not workers or any(phase not in w for w in workers):
            continue
        starts = [w[phase][0] for w in workers]
        ends = [w[phase][1] for w in workers]
        out[f"{WORKERS}/{START_LAG}/{phase}"] = max(starts) - start
        out[f"{WORKERS}/{END_SPREAD}/{phase}"] = max(ends) - min(ends)
        out[f"{WORKERS}/{COLLECT}/{phase}"] = end - max(ends)
    return out
