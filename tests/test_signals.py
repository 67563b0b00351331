"""Signals at each stage of a benchmark session (issue 14, defect 6): SIGINT and SIGTERM while the
embedded Ray starts and while the session's fixtures set up the trainer, and SIGKILL of pytest.

Each test runs a real pytest session in a subprocess, waits for an event it can observe (a Ray
process appearing under the session, a file the test writes), sends the signal, and then lists
every process that descended from the session (by parent pid, each known by its pid and start
time, so a reused pid does not count). Every process of ours must be gone soon after the exit.
Timeouts are generous: the development machine has 2 shared cores, where a Ray start takes 5-30 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_faults import INTERRUPTED_SESSION, SMALL, default_sigint, env_with_repo

from trainer.driver.ray_processes import command_line, descendants

REACH_S = 300.0  # from the session's start to the event the test waits for
EXIT_S = 180.0  # from the signal to pytest's exit
GONE_S = 5.0  # from pytest's exit (an interrupt) to the last process of ours gone
KILLED_GONE_S = 20.0  # from a SIGKILL to the last process of ours gone (Ray alone: about 61 s)


def start_time(pid: int) -> str | None:
    """The start time of ``pid`` (in clock ticks since boot), None once it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


class Session:
    """A pytest session in a subprocess, and every process seen under it."""

    def __init__(self, path: Path) -> None:
        env = env_with_repo()
        env.pop("RAY_ADDRESS", None)
        self.path = path
        self.log = path / "session.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *[f"--rl-config={o}" for o in SMALL]],
                cwd=path, env=env, stdout=out, stderr=subprocess.STDOUT, text=True, preexec_fn=default_sigint,
            )
        self.seen: dict[int, str] = {}  # pid -> start time

    def poll(self) -> None:
        for pid in descendants(self.proc.pid):
            if (started := start_time(pid)) is not None:
                self.seen.setdefault(pid, started)

    def running(self) -> list[int]:
        """The processes seen under the session that still run (same pid, same start time)."""
        return sorted(pid for pid, started in self.seen.items() if start_time(pid) == started)

    def names(self, pids: list[int]) -> list[str]:
        return [f"{pid} {command_line(pid)[:80]}" for pid in pids]

    def wait_for(self, event: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + REACH_S
        while not event():
            assert self.proc.poll() is None, f"the session ended before {what}:\n{self.output()[-3000:]}"
            assert time.monotonic() < deadline, f"no {what} within {REACH_S:.0f} s"
            time.sleep(0.1)
            self.poll()

    def has_process(self, mark: str) -> bool:
        return any(mark in command_line(pid) for pid in self.running())

    def wait_exit(self) -> int:
        """Wait for pytest to exit, still listing what starts under it meanwhile; its exit status."""
        deadline = time.monotonic() + EXIT_S
        while self.proc.poll() is None:
            assert time.monotonic() < deadline, f"pytest still runs {EXIT_S:.0f} s after the signal"
            self.poll()
            time.sleep(0.1)
        return self.proc.returncode

    def left_after(self, within_s: float) -> list[int]:
        deadline = time.monotonic() + within_s
        while (left := self.running()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def end(self) -> None:
        """Kill, by pid, whatever of the session still runs (a failed test must not leave Ray running)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        for pid in self.running():
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def session(pytester: pytest.Pytester) -> Iterator[Session]:
    pytester.makepyfile(INTERRUPTED_SESSION)  # a test on rl_trainer that writes "ready", then sleeps
    running = Session(pytester.path)
    try:
        yield running
    finally:
        running.end()


# The stage a signal arrives in, and the process whose appearance under the session shows it began:
# Ray's GCS is the first process ray.init starts (and it has far from finished then: the raylet, the
# agents and the driver's connection follow), and a TrainWorker is Ray's worker once the rl_trainer
# fixture asked for one (its model, optimizer and process group are set up after).
STAGES = {"ray-start": "gcs_server", "trainer-set-up": "ray::TrainWorker"}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
@pytest.mark.parametrize("stage", list(STAGES))
def test_a_signal_before_the_first_test_exits_2_with_one_line_and_leaves_no_process(
    session: Session, stage: str, sig: signal.Signals
) -> None:
    mark = STAGES[stage]
    session.wait_for(lambda: session.has_process(mark), f"{mark} under the session")
    os.kill(session.proc.pid, sig)
    sent = time.monotonic()
    status = session.wait_exit()
    print(f"{stage} {sig.name}: exit {status} {time.monotonic() - sent:.1f} s after the signal")  # the docs' row
    out = session.output()
    assert status == pytest.ExitCode.INTERRUPTED, out[-3000:]
    said = [line for line in out.splitlines() if line.startswith("rlbench: interrupted")]
    assert said == [f"rlbench: interrupted by {sig.name}: stopping the trainer's workers, then Ray; exit status 2"], out
    assert "Traceback" not in out and "INTERNALERROR" not in out, out[-3000:]
    assert not (session.path / "ready").exists(), "the signal came after the set-up: the test body ran"
    left = session.left_after(GONE_S)
    assert not left, f"{len(left)} process(es) of the session outlived it: {session.names(left)}"


def test_after_a_sigkill_of_pytest_every_ray_process_is_gone_within_seconds(session: Session) -> None:
    # SIGKILL cannot be caught. Ray's GCS and raylet die with pytest, and its dashboard and
    # runtime-env agents used to wait 60 s on the dead GCS; the local Ray's watchdog ends them.
    session.wait_for(lambda: (session.path / "ready").exists(), "test body")
    session.poll()
    assert session.has_process("ray::DashboardAgent") and session.has_process("ray::RuntimeEnvAgent")
    os.kill(session.proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    session.proc.wait(timeout=30)
    left = session.left_after(KILLED_GONE_S)
    took = time.monotonic() - killed
    print(f"SIGKILL: every process of the session gone {took:.1f} s after it")  # the docs' row
    assert not left, f"{took:.1f} s after the SIGKILL, {len(left)} process(es) still run: {session.names(left)}"


# ----------------------------------------------------------------------------- the watchdog alone (no Ray)
WATCHED_PARENT = """
import os, subprocess, sys, time
from trainer.driver.ray_watchdog import MARK_ENV, Watchdog

dog = Watchdog()
child = subprocess.Popen(["sleep", "300"], env={**os.environ, MARK_ENV: dog.mark})
plain = subprocess.Popen(["sleep", "300"])
print(dog.pid, child.pid, plain.pid, flush=True)
time.sleep(300)
"""


def test_the_watchdog_ends_the_marked_processes_once_its_parent_is_killed(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", WATCHED_PARENT], stdout=subprocess.PIPE, text=True, env=env_with_repo()
    )
    dog = child = plain = 0
    try:
        dog, child, plain = map(int, parent.stdout.readline().split())
        os.kill(dog, signal.SIGTERM)  # a signal to the whole process group: the parent still lives
        time.sleep(1.0)
        assert start_time(dog) is not None and start_time(child) is not None, "the watchdog acted too early"
        parent.kill()
        parent.wait(timeout=30)
        deadline = time.monotonic() + 20
        while (start_time(child) or start_time(dog)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert start_time(child) is None, "the marked process outlived its killed parent"
        assert start_time(dog) is None, "the watchdog outlived its work"
        assert start_time(plain) is not None, "an unmarked process was ended"
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in (dog, child, plain):
            if pid and start_time(pid) is not None:
                os.kill(pid, signal.SIGKILL)
