"""Atomic checkpoints: a crash mid-save never leaves a directory that loads as valid.

A checkpoint is written into a temporary directory beside its final place, every file is flushed to
disk, a manifest with each file's size and SHA-256 is written last, and only then is the directory
renamed into place (an atomic rename on POSIX file systems). The tracker file that names the latest
step (VERL's ``latest_checkpointed_iteration.txt``) is replaced atomically after that. Loading checks
the manifest, so a truncated or altered file is an error, not a silently different model.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

MANIFEST = "manifest.json"
TRACKER = "latest_checkpointed_iteration.txt"
FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint directory is missing, incomplete or corrupt; the message names the file."""


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"global_step_{step}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def save_checkpoint(root: str | Path, step: int, parts: dict[str, Any], meta: dict[str, Any] | None = None) -> Path:
    """Write ``parts`` (name -> torch-serialisable object) as step ``step`` under ``root``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = step_dir(root, step)
    tmp = Path(tempfile.mkdtemp(prefix=f".global_step_{step}.tmp-", dir=root))
    try:
        files: dict[str, dict[str, Any]] = {}
        for name, obj in parts.items():
            path = tmp / f"{name}.pt"
            with path.open("wb") as fh:
                torch.save(obj, fh)
                fh.flush()
                os.fsync(fh.fileno())
            files[path.name] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
        manifest = {"format_version": FORMAT_VERSION, "step": step, "files": files, "meta": meta or {}}
        _write_atomic_text(tmp / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True))
        _fsync_dir(tmp)
        if final.exists():  # re-saving a step: move the old one aside first, then drop it
            old = root / f".global_step_{step}.old-{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _write_atomic_text(root / TRACKER, str(step))
    return final


def verify_checkpoint(path: str | Path) -> dict[str, Any]:
    """Return the manifest of a complete checkpoint, or raise CheckpointError saying what is wrong."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"{path}: no {MANIFEST}; the checkpoint is incomplete (interrupted save?)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{manifest_path}: not valid JSON ({exc})") from exc
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{manifest_path}: format_version {manifest.get('format_version')!r}, expected {FORMAT_VERSION}"
        )
    for name, info in manifest["files"].items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{file}: listed in the manifest but missing")
        if file.stat().st_size != info["bytes"] or _sha256(file) != info["sha256"]:
            raise CheckpointError(f"{file}: size or SHA-256 differs from the manifest (corrupt)")
    return manifest


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[dict[str, Any], dict[str, Any]]:
    """Verify, then load every part: returns (parts, manifest)."""
    path = Path(path)
    manifest = verify_checkpoint(path)
    parts = {
        Path(name).stem: torch.load(path / name, map_location=map_location, weights_only=False)
        for name in manifest["files"]
    }
    return parts, manifest


def latest_checkpoint(root: str | Path) -> Path | None:
    """The step named by the tracker file, if that checkpoint verifies; None when there is none."""
    tracker = Path(root) / TRACKER
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    if not text.isdigit():
        raise CheckpointError(f"{tracker}: expected a step number, found {text!r}")
    path = step_dir(root, int(text))
    verify_checkpoint(path)
    return path
