"""The session's output files (JSON report, its chart, the saved baseline): checked at start-up,
written at the end so that none is lost.

At start-up each path is probed the way it will be written (a temporary file created and removed
in its directory), so a path that cannot be written is a usage error before any test runs, not a
traceback after hours of benchmarks. At the end each file is written on its own, to a temporary
file in the same directory that is then renamed over the target (``os.replace`` is atomic on
POSIX): a reader never sees half a file, and a failure leaves the previous file as it was. The file
gets the mode a plain ``open`` would give it (0o666 less the user's umask), not ``mkstemp``'s 0o600.
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def _missing_parents(path: Path) -> list[Path]:
    """The ancestors of ``path`` that do not exist yet, nearest the root first."""
    missing = []
    for parent in path.parents:
        if parent.exists():
            break
        missing.append(parent)
    return missing[::-1]


def _read_only(path: Path) -> bool:
    # Mode bits, not os.access: as root os.access says yes to a file the user marked read-only.
    return not path.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)


def write_problem(path: Path) -> str | None:
    """Why ``path`` could not be written as an output file, or None if it can.

    Probes the directory with a temporary file, creating missing parent directories for the probe
    and removing them again, so nothing is left on disk either way."""
    if path.is_dir():
        return "it is a directory"
    if path.exists() and not path.is_file():
        return "it exists and is not a regular file"
    if path.is_file() and _read_only(path):
        return "the file is read-only"
    created: list[Path] = []
    try:
        for parent in _missing_parents(path):
            parent.mkdir()
            created.append(parent)
        if _read_only(path.parent):
            return f"the directory {str(path.parent)!r} is read-only"
        fd, probe = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"cannot write in {str(path.parent)!r}: {exc.strerror or exc}"
    finally:
        for parent in reversed(created):
            try:
                parent.rmdir()
            except OSError:
                pass
    return None


def clashing_outputs(named: Mapping[str, Path | None]) -> str | None:
    """A message if two outputs (e.g. {"--rl-report": ..., "its chart": ...}) are one file, else None."""
    seen: dict[Path, str] = {}
    for name, path in named.items():
        if path is None:
            continue
        key = path.resolve()
        if key in seen:
            return f"{seen[key]} and {name} are the same file {str(path)!r}: each output needs its own path"
        seen[key] = name
    return None


def current_umask() -> int:
    """The process's umask. POSIX can only read it by setting it, so it is set back at once."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: Path, write: Callable[[Path], object]) -> Path:
    """Call ``write(temp_path)`` for a temporary file beside ``path``, then rename it to ``path``.

    The temporary file keeps ``path``'s suffix (matplotlib picks the format from it) and is removed
    if anything fails. Parent directories are created. The file ends with mode 0o666 less the umask,
    as ``open`` would create it: ``mkstemp`` makes it 0o600, which would hide a shared CI runner's
    reports and baselines from the rest of the team."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp{path.suffix}")
    os.close(fd)
    temp = Path(temp_name)
    try:
        write(temp)
        os.chmod(temp, 0o666 & ~current_umask())
        os.replace(temp, path)
    finally:
        if temp.exists():
            temp.unlink()
    return path


def write_text_atomic(path: Path, text: str) -> Path:
    return write_atomic(path, lambda temp: temp.write_text(text, encoding="utf-8"))


def finite_or_null(value: Any) -> Any:
    """``value`` with every non-finite float (inf, nan) replaced by None, for strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_null(v) for v in value]
    return value


def dumps_report(report: Mapping[str, Any]) -> str:
    """The JSON report's text: indented, strict JSON (a non-finite figure is written as null)."""
    return json.dumps(finite_or_null(report), indent=2, allow_nan=False) + "\n"


def failure_line(what: str, path: Path, exc: BaseException) -> str:
    """One line naming the file that could not be written and why."""
    if isinstance(exc, OSError) and exc.strerror:
        # The path at fault may be a parent directory (a file where a directory should be).
        at = exc.filename and str(exc.filename) != str(path)
        reason = f"{exc.strerror}: {str(exc.filename)!r}" if at else exc.strerror
    else:  # a multi-line message (a BaselineError lists its problems) joined into one line
        reason = " ".join(line.strip() for line in str(exc).splitlines()) or type(exc).__name__
    return f"could not write {what} {str(path)!r}: {reason}"
