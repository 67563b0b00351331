"""Interrupts and failed workers during a benchmark session.

- SIGTERM is handled like Ctrl-C from the moment the session starts its cluster: it raises
  KeyboardInterrupt, so pytest tears the session down in order (the trainer's workers, then Ray)
  and exits with status 2. Ray's own driver handler (``sys.exit`` from inside ray.init's caller)
  ended such sessions with SIGABRT and left Ray's processes running.
- An interrupt prints one line saying what is being stopped.
- A usage error found once tests run (``SessionUsageError``) is one ``ERROR: pytest-rlbench: ...``
  line with exit 4, as at start-up.
- A test that fails because a worker died or hung (trainer.driver.worker_group.WorkerFailure) is
  reported with that one-line message (phase, rank, node) instead of Ray's traceback.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Generator
from typing import Any

import pytest

_handled: list[str] = []  # the signals ``_interrupt`` turned into KeyboardInterrupt, in order


def _interrupt(signum: int, frame: Any) -> None:
    # Recorded as well as raised: raised inside Ray's Cython code, the interrupt can come back out
    # as a new KeyboardInterrupt without this text (seen in CI: SIGTERM reported as SIGINT).
    _handled.append(signal.Signals(signum).name)
    raise KeyboardInterrupt(_handled[-1])


class FaultHandling:
    """A per-session plugin object (it needs the session's config in hooks that are not given it)."""

    NAME = "rlbench-faults"

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.previous_sigterm: Any = None
        self.installed = False

    def handle_sigterm_as_interrupt(self) -> None:
        """Install (again: ray.init replaces it) the handler that turns SIGTERM into KeyboardInterrupt."""
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.signal(signal.SIGTERM, _interrupt)
        if not self.installed:
            self.previous_sigterm, self.installed = previous, True

    @pytest.hookimpl(wrapper=True)
    def pytest_collection_finish(self, session: pytest.Session) -> Generator[None, None, None]:
        # The plugin starts the cluster here (before the first test) when tests use its fixtures.
        from pytest_rlbench.session.fixtures import rl_fixtures_used

        uses_cluster = not session.config.option.collectonly and bool(rl_fixtures_used(session.items))
        if uses_cluster:
            self.handle_sigterm_as_interrupt()  # a SIGTERM while Ray starts stops what it started
        try:
            return (yield)
        finally:
            if uses_cluster:
                self.handle_sigterm_as_interrupt()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, Any, Any]:
        # A usage error found inside a test (session/fixtures.SessionUsageError) ends the session as a
        # start-up one does: one "ERROR: pytest-rlbench: ..." line and exit 4, not pytest.exit's banner.
        from pytest_rlbench.session.fixtures import SessionUsageError

        try:
            return (yield)
        except SessionUsageError as exc:
            raise pytest.UsageError(exc.msg) from None

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        if excinfo.errisinstance(pytest.exit.Exception):
            return  # pytest.exit (a resource that failed to build inside a test, say) says why; not an interrupt
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            cause = str(excinfo.value) or (_handled[-1] if _handled else "SIGINT")
            reporter.write_line(
                f"rlbench: interrupted by {cause}: stopping the trainer's workers, then Ray; exit status 2"
            )

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
        report = yield
        group = sys.modules.get("trainer.driver.worker_group")  # loaded once a trainer was built
        if group is not None and call.excinfo is not None and call.excinfo.errisinstance(group.WorkerFailure):
            report.longrepr = f"{item.nodeid}: {call.excinfo.value}"
        return report

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.installed and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.previous_sigterm)
            self.installed = False
