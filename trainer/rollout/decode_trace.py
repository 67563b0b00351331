"""Where a generation's decode time goes, read at the decode loop's own host checks: how many rows
still ran over each stretch of steps and how long that stretch took.

The fast engine reads the host every ``check_every`` steps anyway (``decode_loop.check_rows``, a
sync), so a wall clock taken there costs nothing extra and times each stretch whole. With
``RLBENCH_DECODE_TRACE=DIR`` in a worker's environment every ``generate`` appends one JSON line to
``DIR/decode-<pid>.jsonl``: the rows' target lengths, the bytes one decode step must read (weights,
K/V per cached token), and the stretches. ``benchmarks/ragged_decode.py`` turns the lines into a
time-per-step-by-rows-alive table and the memory-bandwidth bound of the same decode.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

TRACE_ENV = "RLBENCH_DECODE_TRACE"


@dataclass
class Stretch:
    """Decode steps ``first`` .. ``last`` (1-based token indices), ``running`` rows not yet ended at
    its start, ``slots`` rows decoded (the compacted batch), and the wall seconds they took."""

    first: int
    last: int
    running: int
    slots: int
    seconds: float


@dataclass
class DecodeTrace:
    """One generate call's decode, stretch by stretch (``mark`` at each host check)."""

    rows: int
    prompt_slots: int  # the cache's prompt width: every row's K/V starts after it
    weight_bytes: int  # what one decode step reads of the weights
    kv_bytes_per_token: int  # one cached token's K and V over all layers, one row
    targets: list[int] | None = None  # each row's target length (None: rows end at their stop token)
    stretches: list[Stretch] = field(default_factory=list)
    _since: tuple[int, int, int, float] | None = None  # (first step, running, slots, clock) of the open stretch

    def mark(self, step: int, running: int, slots: int) -> None:
        """At a host check before decode step ``step``: close the open stretch, open the next."""
        now = time.perf_counter()
        if self._since is not None:
            first, was_running, was_slots, start = self._since
            self.stretches.append(Stretch(first, step - 1, was_running, was_slots, now - start))
        self._since = (step, running, slots, now)

    def finish(self, steps: int) -> None:
        """After the loop: ``steps`` tokens were generated; the last stretch ends with them."""
        self.mark(steps, 0, 0)
        self._since = None

    def to_json(self) -> str:
        data = asdict(self)
        data.pop("_since")
        return json.dumps(data)


def trace_dir(environ: dict[str, str] | None = None) -> Path | None:
    """The directory ``RLBENCH_DECODE_TRACE`` names, or None: tracing off."""
    value = (os.environ if environ is None else environ).get(TRACE_ENV, "")
    return Path(value) if value else None


def write_trace(trace: DecodeTrace, directory: Path) -> Path:
    """Append the trace as one line to this process's file in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"decode-{os.getpid()}.jsonl"
    with path.open("a") as out:
        out.write(trace.to_json() + "\n")
    return path
