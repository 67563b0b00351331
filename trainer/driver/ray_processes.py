"""The processes a local Ray consists of, and stopping all of them.

``ray.shutdown`` stops the GCS and the raylet, but the raylet's children (the dashboard and
runtime-env agents, idle workers) outlive it by up to a minute, and a start interrupted by Ctrl-C
or SIGTERM leaves whatever it had started. ``stop_ray`` therefore lists Ray's processes that
descend from this one first (read from /proc: Linux), then shuts Ray down, then ends the ones still
running: SIGTERM, and SIGKILL after a grace period. (A killed driver cannot do this: the watchdog of
``ray_watchdog`` does it then.)
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Collection

# What the command line of a process that Ray started holds (gcs_server, raylet, ray::IDLE, the
# dashboard and runtime-env agents run from ray/dashboard and ray/_private).
RAY_PROCESS_MARKS = ("/ray/", "ray::", "raylet", "gcs_server")
STOP_GRACE_S = 5.0


def _stat_fields(pid: int) -> list[str] | None:
    # /proc/PID/stat after the command name (which may hold spaces and parentheses): state, ppid, ...
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def pid_state(pid: int) -> str | None:
    """The process's state letter from /proc (R running, S sleeping, T stopped, Z zombie), or None."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def pid_running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a zombie holds no files or sockets)."""
    fields = _stat_fields(pid)
    if fields is not None:
        return fields[0] != "Z"
    if os.path.isdir("/proc"):
        return False
    try:  # no /proc: ask the kernel
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def command_line(pid: int) -> str:
    """The command line of ``pid``, its arguments joined by spaces ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def descendants(root: int | None = None) -> list[int]:
    """The pids of every process that descends from ``root`` (default: this process), by parent pid."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit() and (fields := _stat_fields(int(entry))) is not None:
            parents[int(entry)] = int(fields[1])
    ours: set[int] = set()
    frontier = {os.getpid() if root is None else root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - ours
        ours |= frontier
    return sorted(ours)


def in_sessions(sessions: Collection[int]) -> list[int]:
    """The running processes whose session id is one of ``sessions``: everything a session leader
    started that did not start a session of its own, also where its parent is gone (a raylet's agents
    once the raylet has died)."""
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        fields = _stat_fields(int(entry)) if entry.isdigit() else None  # state, ppid, pgrp, session, ...
        if fields is not None and int(fields[3]) in sessions and fields[0] != "Z":
            found.append(int(entry))
    return found


def ray_descendants(root: int | None = None) -> list[int]:
    """The pids of Ray's processes that descend from ``root`` (default: this process)."""
    return [pid for pid in descendants(root) if any(mark in command_line(pid) for mark in RAY_PROCESS_MARKS)]


def _signal_each(pids: list[int], sig: int) -> list[int]:
    sent = []
    for pid in pids:
        try:
            os.kill(pid, sig)
            sent.append(pid)
        except ProcessLookupError:
            pass
    return sent


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    """Those of ``pids`` still running after waiting up to ``seconds`` for them to end."""
    deadline = time.monotonic() + seconds
    left = [pid for pid in pids if pid_running(pid)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [pid for pid in left if pid_running(pid)]
    return left


def end_processes(pids: list[int], grace_s: float = STOP_GRACE_S) -> list[int]:
    """SIGTERM each of ``pids``, then SIGKILL those still running after ``grace_s``, and wait (up to
    ``grace_s`` again) until they are gone, so that nothing of ours still runs when the session
    returns. Returns the pids still running after that (none, unless the kernel is stuck)."""
    left = _wait_gone(_signal_each(pids, signal.SIGTERM), grace_s)
    return _wait_gone(_signal_each(left, signal.SIGKILL), grace_s)


def stop_ray(spare: Collection[int] = ()) -> None:
    """``ray.shutdown()``, then end every Ray process descending from this one that still runs,
    except ``spare`` (``ray_descendants()`` taken before this process started its Ray: a cluster
    that a test fixture runs in this process is not ours to stop), and the local Ray's watchdog."""
    import ray

    from trainer.driver.ray_local import stop_watchdog

    started = sorted(set(ray_descendants()) - set(spare))
    try:
        if ray.is_initialized():
            ray.shutdown()
    finally:
        stop_watchdog()  # first: a watchdog's own command line could hold "/ray/"
        end_processes([pid for pid in started if pid_running(pid)])
