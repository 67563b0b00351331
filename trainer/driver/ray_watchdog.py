"""End a local Ray's processes when the process that started it dies without stopping it (SIGKILL).

Ray starts its GCS and raylet so that the kernel kills them with their parent (PR_SET_PDEATHSIG), and
its workers notice the raylet's death within about 2 s. Its dashboard and runtime-env agents notice
it too, but first publish "the raylet died" to the GCS, dead as well, with a deadline of 60 s written
into Ray (Ray 2.60 ray/_private/process_watcher.py: report_raylet_error_logs, which calls
ray._private.utils.publish_error_to_driver), so they outlive a killed driver by a minute; no option
or environment variable shortens it, and SIGKILL cannot be caught. So ``Watchdog`` runs this file as
a small process beside Ray. Once a second it notes Ray's processes: the children of its parent whose
environment holds ``MARK_ENV`` with its mark (``trainer.driver.ray_local.init_local_ray`` puts it
there while ``ray.init`` starts the GCS and raylet), and everything under them. The mark cannot be
looked for in the agents and workers themselves: they set their process titles (``ray::...``), which
may overwrite the environment that /proc shows. When its parent dies (PR_SET_PDEATHSIG, and a look
at its parent pid each second) it ends the processes it noted. It runs as a script on the standard
library only: it must not import torch or Ray.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

MARK_ENV = "RLBENCH_RAY_MARK"
LOOK_S = 1.0  # how often the watchdog notes the processes under Ray's (one /proc scan, about 2 ms)
STOP_GRACE_S = 2.0
PR_SET_PDEATHSIG = 1


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:  # gone, or not ours to read
        return b""


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of a live process, None once it is gone or a zombie."""
    fields = _read(f"/proc/{pid}/stat").rsplit(b")", 1)[-1].split()
    if len(fields) < 20 or fields[0] == b"Z":
        return None
    return int(fields[1]), fields[19].decode()


def is_marked(pid: int, mark: str) -> bool:
    return f"{MARK_ENV}={mark}".encode() in _read(f"/proc/{pid}/environ").split(b"\0")


def _live() -> dict[int, tuple[int, str]]:
    return {int(e): st for e in os.listdir("/proc") if e.isdigit() and (st := _stat(int(e))) is not None}


def ray_tree(parent: int | None, mark: str) -> dict[int, str]:
    """pid -> start time of every process under ``parent``'s children that carry ``mark`` (Ray's GCS
    and raylet), those children included; with ``parent`` None, under any process that shows it."""
    stats = _live()
    frontier = {
        pid for pid, (ppid, _) in stats.items() if (parent is None or ppid == parent) and is_marked(pid, mark)
    }
    tree: set[int] = set()
    while frontier:
        tree |= frontier
        frontier = {pid for pid, (ppid, _) in stats.items() if ppid in frontier} - tree
    return {pid: stats[pid][1] for pid in tree}


def end_processes(noted: dict[int, str], grace_s: float = STOP_GRACE_S) -> list[int]:
    """SIGTERM each noted process that still runs (same pid, same start time), SIGKILL those left
    after ``grace_s``; the pids signalled."""
    def running() -> list[int]:
        return [pid for pid, started in noted.items() if (st := _stat(pid)) is not None and st[1] == started]

    pids = running()
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
        for pid in running():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and running():
            time.sleep(0.1)
    return pids


def _watch(mark: str, parent: int) -> None:
    # SIGINT and SIGTERM come blocked from the start (``Watchdog``): a Ctrl-C of the terminal is the
    # driver's to handle, and a SIGTERM while the parent lives (a process-group kill) is ignored.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    noted: dict[int, str] = {}
    while os.getppid() == parent:
        noted = {pid: st for pid, st in noted.items() if _stat(pid) is not None} | ray_tree(parent, mark)
        signal.sigtimedwait({signal.SIGTERM}, LOOK_S)
    end_processes(noted | ray_tree(None, mark))  # and any that started since the last look and show it


class Watchdog:
    """The watchdog process of one local Ray, started by this process."""

    def __init__(self) -> None:
        self.mark = f"{os.getpid()}-{os.urandom(8).hex()}"
        devnull = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
        self.pid = os.posix_spawn(
            sys.executable,
            [sys.executable, "-I", os.path.abspath(__file__), self.mark, str(os.getpid())],
            {k: v for k, v in os.environ.items() if k != MARK_ENV},
            file_actions=devnull,
            setsigmask={signal.SIGINT, signal.SIGTERM},  # blocked before its first instruction
            setpgroup=0,  # its own process group: a SIGKILL to the driver's group (timeout -s KILL) spares it
        )
        self.stopped = False

    def stop(self) -> None:
        """End the watchdog (Ray was stopped in order); idempotent."""
        if not self.stopped:
            self.stopped = True
            try:
                os.kill(self.pid, signal.SIGKILL)  # our child, not yet waited for: the pid is still its
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):  # reaped by someone else's wait
                pass


if __name__ == "__main__":
    _watch(sys.argv[1], int(sys.argv[2]))
