"""Stored baselines: finding them by name or path and loading them.

A baseline is a run record (``pytest_rlbench.records.record``) saved as JSON. The built-in ones live in the
repository's top-level ``baselines/`` directory; see ``baseline_dirs`` for how an installed package
finds them. Each file's provenance names its public source (the VERL and RLinf benchmark tables of
RLinf's "Comparison with VeRL" page, docs/source-en/rst_source/blog/compare_with_verl.rst in the RLinf
repository).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pytest_rlbench.records.record import BaselineError, RunRecord, load_record

# Short names users pass to --rl-baseline; each file's stem works too.
BUILTIN_BASELINES: dict[str, str] = {
    "verl-7b": "verl-f252da3-r1-distill-qwen-7b-8x8.json",
    "verl-v0.5.0-1.5b": "verl-v0.5.0-8fdc4d3-r1-distill-qwen-1.5b-1x8-h100.json",
    "rlinf-1.5b": "rlinf-r1-distill-qwen-1.5b-1x8-h100.json",
}
# Compared with, as references, when a session names no baseline.
PUBLISHED_BASELINES: tuple[str, ...] = tuple(BUILTIN_BASELINES)

_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # pytest_rlbench/


def baseline_dirs(extra: Iterable[str | Path] = ()) -> list[Path]:
    """Directories searched for baseline files, first match wins, each listed once.

    ``extra`` (e.g. from a plugin hook) first; then the package's ``baselines_data``: in a checkout a
    symbolic link to the top-level ``baselines/`` (the canonical copy), in a built wheel a real
    directory holding copies of the files (package data); then the checkout's ``baselines/`` itself,
    for a checkout where the link did not survive (e.g. on Windows).
    """
    candidates = [Path(p) for p in extra] + [_PACKAGE_DIR / "baselines_data", _PACKAGE_DIR.parent / "baselines"]
    found: dict[Path, Path] = {}
    for d in candidates:
        if d.is_dir():
            found.setdefault(d.resolve(), d)
    return list(found.values())


def resolve_baseline(name_or_path: str | Path, search_dirs: Iterable[str | Path] = ()) -> Path:
    """The file for a built-in name, a file stem in a baseline directory, or a path."""
    text = str(name_or_path)
    dirs = baseline_dirs(search_dirs)
    wanted = BUILTIN_BASELINES.get(text, text if text.endswith(".json") else f"{text}.json")
    direct = Path(text).expanduser()
    if direct.is_file():
        return direct
    for d in dirs:
        if (d / wanted).is_file():
            return d / wanted
    searched = ", ".join(str(d) for d in dirs) or "(no baseline directory found)"
    raise BaselineError(
        text,
        [
            f"no such file, and no baseline of that name; built-in names: {', '.join(BUILTIN_BASELINES)}; "
            f"searched: {searched}"
        ],
    )


def load_baseline(name_or_path: str | Path, search_dirs: Iterable[str | Path] = ()) -> RunRecord:
    """Resolve and load a baseline (see ``resolve_baseline``)."""
    return load_record(resolve_baseline(name_or_path, search_dirs))
