"""What the session is doing while it works: set-up, the warm-up step, each phase's rounds.

One tqdm bar per stage ("set-up: starting Ray 3/4", "gen: round 2/5"), written to stderr with
pytest's capture suspended for each write, so nothing of it lands in a test's captured output.
``--rl-progress`` picks when: ``auto`` (the default) only when pytest's output is a terminal, ``on``
also into a log or a pipe, ``off`` never.

On a terminal a bar is transient: it is drawn on the line below pytest's current one, and on close
it is erased and the cursor put back where pytest left it, so pytest's own lines read as without
it. Elsewhere (``on`` into a file) each stage leaves its final state as one line of its own,
as pytest's live logging does.

tqdm rather than rich: a bar is one line written to a file object we choose (here one that suspends
pytest's capture), with no live display thread or terminal takeover to coordinate with pytest's
terminal reporter.

Granularity is the stage and the round. Steps inside a round (decode steps, micro-batches) run in
the Ray workers; reporting them would need a channel from the actors back to the driver.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

PROGRESS_KEY = pytest.StashKey["Progress"]()


class _CaptureFreeStream:
    """A file for tqdm: stderr as pytest found it, each write with pytest's capture suspended."""

    def __init__(self, capman: Any) -> None:
        self._capman = capman

    @contextmanager
    def _uncaptured(self) -> Iterator[None]:
        if self._capman is None:
            yield
        else:
            with self._capman.global_and_fixture_disabled():
                yield

    def write(self, text: str) -> int:
        with self._uncaptured():
            sys.stderr.write(text)
            sys.stderr.flush()
        return len(text)

    def flush(self) -> None:
        with self._uncaptured():
            sys.stderr.flush()

    def isatty(self) -> bool:
        """True when both pytest's output (stdout) and the bars' (stderr) are a terminal."""
        with self._uncaptured():
            return sys.stdout.isatty() and sys.stderr.isatty()


class Stage:
    """One stage's bar: ``step(label)`` names what runs now, ``done()`` counts it finished."""

    def __init__(self, bar: Any | None, name: str) -> None:
        self._bar = bar
        self.name = name

    def step(self, label: str) -> None:
        if self._bar is not None:
            self._bar.set_description_str(f"{self.name}: {label}", refresh=True)

    def done(self, *_: Any, **__: Any) -> None:  # also pytest-benchmark's teardown (given the round's args)
        if self._bar is not None:
            self._bar.update(1)


def round_label(index: int, warmup: int, rounds: int) -> str:
    """What the ``index``-th call (0-based, warm-up rounds first) of a phase benchmark is."""
    if index < warmup:
        return f"warm-up round {index + 1}/{warmup}"
    if index < warmup + rounds:
        return f"round {index - warmup + 1}/{rounds}"
    return "after the timed rounds"  # pytest-benchmark's --benchmark-cprofile calls once more


class Progress:
    """The session's progress bars (see the module docstring); a disabled one draws nothing."""

    def __init__(self, enabled: bool, terminal: bool, capman: Any = None, reporter: Any = None) -> None:
        self.enabled = enabled
        self.terminal = terminal
        self._stream = _CaptureFreeStream(capman)
        self._reporter = reporter

    @contextmanager
    def stage(self, name: str, total: int | None = None) -> Iterator[Stage]:
        """A bar for one stage of ``total`` steps (None: a count without an end) while the block runs."""
        if not self.enabled:
            yield Stage(None, name)
            return
        from tqdm import tqdm

        column = self._leave_pytest_line()
        bar = tqdm(
            total=total, desc=name, file=self._stream, leave=not self.terminal, dynamic_ncols=self.terminal,
            bar_format="{desc} [{elapsed}]" if total is None else "{desc} {bar:20} [{elapsed}]",
        )
        try:
            yield Stage(bar, name)
        finally:
            bar.close()
            if self.terminal and column is not None:
                self._stream.write(f"\x1b[A\x1b[{column + 1}G")  # back to the end of pytest's line

    def _leave_pytest_line(self) -> int | None:
        """Move below pytest's unfinished line; return its width when the cursor is to come back to it."""
        writer = getattr(self._reporter, "_tw", None)
        width = getattr(writer, "width_of_current_line", 0) if writer is not None else 0
        if self.terminal:
            if not width:
                return None
            self._stream.write("\n")
            return width
        if self._reporter is not None:
            self._reporter.ensure_newline()  # pytest starts a new line (and its prefix) after ours
        return None


def resolve_enabled(mode: str, terminal: bool) -> bool:
    """Whether bars are drawn: ``on`` always, ``off`` never, ``auto`` on a terminal only."""
    return mode == "on" or (mode == "auto" and terminal)


def progress_for(config: pytest.Config, mode: str = "auto") -> Progress:
    """The session's Progress, made on first use from ``mode`` (--rl-progress) and pytest's terminal."""
    found = config.stash.get(PROGRESS_KEY, None)
    if found is not None:
        return found
    capman = config.pluginmanager.getplugin("capturemanager")
    reporter = config.pluginmanager.getplugin("terminalreporter")
    terminal = _CaptureFreeStream(capman).isatty() and reporter is not None
    progress = Progress(resolve_enabled(mode, terminal), terminal, capman, reporter)
    config.stash[PROGRESS_KEY] = progress
    return progress
