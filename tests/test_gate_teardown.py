"""The session's teardown returns only once the processes it ended are gone, so that the next
session (a CI job's, or the error-rate harness's next run) never starts beside them."""

from __future__ import annotations

import subprocess
import sys
import time

from trainer.driver.ray_processes import end_processes, pid_running

IGNORES_SIGTERM = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(60)\n"


def test_a_process_that_ignores_sigterm_is_killed_and_gone_when_end_processes_returns() -> None:
    child = subprocess.Popen([sys.executable, "-c", IGNORES_SIGTERM], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        start = time.monotonic()
        assert end_processes([child.pid], grace_s=0.5) == []
        assert not pid_running(child.pid)  # a zombie (not yet reaped by its parent) holds nothing
        assert time.monotonic() - start < 5
    finally:
        child.kill()
        child.wait()
