"""One writer per checkpoint directory: a lock file held for a trainer's lifetime, and the clean-up
of temporaries that writers which died mid-save left behind.

Two runs that save into one directory would interleave their steps silently (and two saves of one
step collide on the final rename), so the first run to save takes an exclusive ``fcntl.flock`` on
``<root>/.rlbench.lock`` and writes its pid into it; any other process is refused with an error
naming the directory and that pid. The kernel drops the lock when its holder exits, however it
exits, so a killed run never blocks the next one. Temporaries carry their writer's pid in their
name (``.global_step_3.tmp-1234-x1y2``), so the ones whose writer is gone can be told apart and
removed when the lock is taken.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
from pathlib import Path

from trainer.driver.ray_processes import pid_running

LOCK_FILE = ".rlbench.lock"
# Temporaries of checkpoint.py: step directories being written or replaced, the tracker's new text.
TEMPORARY = re.compile(
    r"^\.(global_step_\d+|latest_checkpointed_iteration\.txt)\.(tmp|old)-((?P<pid>\d+)(-|$))?"
)


class CheckpointLockError(RuntimeError):
    """The checkpoint directory is in use by another process."""


def stale_temporaries(root: Path) -> list[Path]:
    """Temporaries in ``root`` whose writer is no longer running (or that name no writer)."""
    out = []
    for entry in sorted(root.iterdir()):
        match = TEMPORARY.match(entry.name)
        if match is None:
            continue
        pid = match.group("pid")
        if pid is None or (int(pid) != os.getpid() and not pid_running(int(pid))):
            out.append(entry)
    return out


def remove_stale_temporaries(root: Path) -> list[Path]:
    """Delete what ``stale_temporaries`` finds; returns what was removed."""
    removed = stale_temporaries(root)
    for path in removed:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return removed


class CheckpointLock:
    """This process's exclusive hold on one checkpoint directory (see the module docstring)."""

    _held: dict[Path, CheckpointLock] = {}  # by resolved root: a process takes each lock once

    def __init__(self, root: Path, fd: int) -> None:
        self.root = root
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, root: str | Path) -> CheckpointLock:
        """Lock ``root`` (created if missing) for this process and remove stale temporaries.

        Taking a lock this process already holds returns that lock. Raises CheckpointLockError
        naming the directory and the holder's pid when another process holds it."""
        root = Path(root).resolve()
        if root in cls._held:
            return cls._held[root]
        root.mkdir(parents=True, exist_ok=True)
        path = root / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            raise CheckpointLockError(
                f"the checkpoint directory {root} is in use by another run (pid {holder}, lock file {path}); "
                "give each run its own trainer.default_local_dir, or wait for that run to end"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        lock = cls(root, fd)
        cls._held[root] = lock
        remove_stale_temporaries(root)
        return lock

    @classmethod
    def held(cls, root: str | Path) -> bool:
        return Path(root).resolve() in cls._held

    def release(self) -> None:
        """Drop the lock (idempotent); the lock file stays, naming no live holder."""
        if self._fd is None:
            return
        self._held.pop(self.root, None)
        os.ftruncate(self._fd, 0)
        os.close(self._fd)  # closing the only descriptor releases the flock
        self._fd = None
