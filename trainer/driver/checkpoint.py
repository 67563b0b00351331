"""Atomic checkpoints: a crash mid-save never leaves a directory that loads as valid.

A checkpoint is written into a temporary directory beside its final place, every file is flushed to
disk, a manifest with each file's size and SHA-256 is written last, and only then is the directory
renamed into place (an atomic rename on POSIX file systems). The tracker file that names the latest
step (VERL's ``latest_checkpointed_iteration.txt``) is replaced atomically after that. Loading checks
the manifest, so a truncated or altered file is an error, not a silently different model.

The driver writes its own part (``trainer.pt``: step, data loader, KL coefficient); the model and
optimizer state are written by the workers themselves, each its own shard, into the same temporary
directory and in parallel (``write_shards``; trainer/workers/shard_state.py), and hashed as they
are written, so nothing is gathered and no file is read back to build the manifest.

Only one process writes into a checkpoint root at a time (trainer/driver/checkpoint_lock.py): a
save takes the root's lock unless this process holds it already (a trainer holds it for its
lifetime), and temporaries carry the writer's pid so that those of dead writers can be removed.

``keep`` (``trainer.max_actor_ckpt_to_keep``, VERL verl/trainer/config/ppo_trainer.yaml; None keeps
all) bounds the complete step directories kept: after a successful save, under the same lock, the
older complete ones beyond the newest ``keep`` are removed. The step just written is never removed,
nor a directory without a manifest (it may be another tool's, or evidence of a crash), nor a step
newer than the one written (a run resumed from an older step leaves later steps alone).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

# CheckpointError is imported from here by callers too: it is this module's error.
from trainer.checkpoint_files import CheckpointError, check_file, load_torch_file, write_torch_file
from trainer.driver.checkpoint_lock import CheckpointLock
from trainer.driver.checkpoint_shards import SHARDS, shard_files

MANIFEST = "manifest.json"
TRACKER = "latest_checkpointed_iteration.txt"
# 2: the workers' shards of model and optimizer state are files of their own, described under
# "shards" (trainer/driver/checkpoint_shards.py). 1: the model and optimizer were whole parts
# (model.pt, optimizer.pt) gathered by the driver; such checkpoints still load.
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)

# Writes the workers' files into the temporary directory it is given; returns their manifest entries
# ("files": name -> {bytes, sha256}) and the "shards" section that describes them.
ShardWriter = Callable[[Path], dict[str, Any]]


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"global_step_{step}"


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


@contextmanager
def _writing(root: Path) -> Iterator[None]:
    # The lock for one save, unless this process holds it already (then it is kept).
    if CheckpointLock.held(root):
        yield
        return
    lock = CheckpointLock.acquire(root)
    try:
        yield
    finally:
        lock.release()


def save_checkpoint(
    root: str | Path,
    step: int,
    parts: dict[str, Any],
    meta: dict[str, Any] | None = None,
    keep: int | None = None,
    write_shards: ShardWriter | None = None,
) -> Path:
    """Write ``parts`` (name -> torch-serialisable object) as step ``step`` under ``root``, with the
    files ``write_shards`` adds to the temporary directory (the workers' shards), then keep at most
    ``keep`` complete step directories (None: all; see the module docstring).

    Raises CheckpointLockError when another process holds ``root``'s lock."""
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be None (keep all) or at least 1, got {keep}")
    root = Path(root)
    with _writing(root):
        final = _save(root, step, parts, meta, write_shards)
        if keep is not None:
            prune_checkpoints(root, step, keep)
        return final


def checkpoint_bytes(path: str | Path) -> int:
    """The bytes of every file a complete checkpoint holds, as its manifest lists them (the workers'
    shards and the driver's part): what a save wrote."""
    manifest_path = Path(path) / MANIFEST
    files = manifest_files(json.loads(manifest_path.read_text()), manifest_path)
    return sum(int(info["bytes"]) for info in files.values())


STEP_DIR = re.compile(r"^global_step_(\d+)$")


def complete_steps(root: str | Path) -> list[int]:
    """The steps under ``root`` whose directory holds a manifest (written last by a save), ascending."""
    steps = []
    for entry in Path(root).iterdir():
        match = STEP_DIR.match(entry.name)
        if match and entry.is_dir() and not entry.is_symlink() and (entry / MANIFEST).is_file():
            steps.append(int(match.group(1)))
    return sorted(steps)


def prune_checkpoints(root: Path, written: int, keep: int) -> list[Path]:
    """Remove the complete steps older than ``written`` beyond the newest ``keep`` (``written`` counted).

    The caller holds ``root``'s lock. Each directory is first renamed to a temporary of this process,
    so an interrupted removal leaves no half-deleted step that looks complete."""
    older = [s for s in complete_steps(root) if s < written]
    doomed = older[: max(len(older) - (keep - 1), 0)]
    removed = []
    for step in doomed:
        aside = root / f".global_step_{step}.old-{os.getpid()}"
        os.replace(step_dir(root, step), aside)
        shutil.rmtree(aside, ignore_errors=True)
        removed.append(step_dir(root, step))
    return removed


def _save(
    root: Path, step: int, parts: dict[str, Any], meta: dict[str, Any] | None, write_shards: ShardWriter | None
) -> Path:
    final = step_dir(root, step)
    tmp = Path(tempfile.mkdtemp(prefix=f".global_step_{step}.tmp-{os.getpid()}-", dir=root))
    try:
        files = {f"{name}.pt": write_torch_file(tmp / f"{name}.pt", obj) for name, obj in parts.items()}
        manifest = {"format_version": FORMAT_VERSION, "step": step, "files": files, "meta": meta or {}}
        if write_shards is not None:
            written = write_shards(tmp)
            for name, info in written["files"].items():
                if name in files:
                    raise CheckpointError(f"{tmp / name}: a shard file has the name of the driver's part {name}")
                _check_written(tmp / name, info)
            files.update(written["files"])
            manifest[SHARDS] = written[SHARDS]
            shard_files(manifest, tmp / MANIFEST)  # never write a section that loading would refuse
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


def _check_written(path: Path, info: dict[str, Any]) -> None:
    # A worker's file the driver cannot see: on several nodes the directory must be shared.
    if not path.is_file() or path.stat().st_size != info["bytes"]:
        raise CheckpointError(
            f"{path}: a worker wrote {info['bytes']} bytes there, but this process finds "
            f"{path.stat().st_size if path.is_file() else 'no file'}; every node must see "
            "trainer.default_local_dir on one shared file system"
        )


def _is_plain_name(name: Any) -> bool:
    # One file directly inside the checkpoint directory: no separator, no "." or "..".
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name


def manifest_files(manifest: dict[str, Any], manifest_path: Path) -> dict[str, dict[str, Any]]:
    """The manifest's ``files`` (name -> {bytes, sha256}), or CheckpointError naming the manifest and field.

    Names must be plain file names: a manifest must not make loading read outside its directory."""
    where = f"{manifest_path}: field 'files'"
    files = manifest.get("files")
    if not isinstance(files, dict):
        found = "none" if files is None else type(files).__name__
        raise CheckpointError(f"{where}: expected a mapping of file name to size and SHA-256, found {found}")
    if not files:
        raise CheckpointError(f"{where}: expected at least one file, found none")
    bad = [name for name in files if not _is_plain_name(name)]
    if bad:
        raise CheckpointError(f"{where}: expected plain file names inside the checkpoint, found {bad!r}")
    for name, info in files.items():
        if not isinstance(info, dict) or not {"bytes", "sha256"} <= set(info):
            raise CheckpointError(f"{where}: expected {name!r} to map to bytes and sha256, found {info!r}")
    return files


def verify_checkpoint(path: str | Path, hash_shards: bool = True) -> dict[str, Any]:
    """Return the manifest of a complete checkpoint, or raise CheckpointError saying what is wrong.

    hash_shards=False checks the workers' shard files by size only: the trainer has its workers
    hash them, each a share, in parallel (``GRPOTrainer.load_checkpoint``)."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"{path}: no {MANIFEST}; the checkpoint is incomplete (interrupted save?)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{manifest_path}: not valid JSON ({exc})") from exc
    if manifest.get("format_version") not in READABLE_VERSIONS:
        raise CheckpointError(
            f"{manifest_path}: format_version {manifest.get('format_version')!r}, expected one of "
            f"{', '.join(map(str, READABLE_VERSIONS))}"
        )
    files = manifest_files(manifest, manifest_path)
    shards = shard_files(manifest, manifest_path)
    for name, info in files.items():
        check_file(path / name, info, hash_bytes=hash_shards or name not in shards)
    return manifest


def load_checkpoint(
    path: str | Path, map_location: str | torch.device = "cpu", hash_shards: bool = True
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Verify, then load every part but the workers' shards: returns (parts, manifest).

    Parts load with ``torch.load(weights_only=True)``: tensors, numbers, strings and plain containers
    only (model and optimizer state dicts, the driver's counters), so a crafted file cannot run code
    while it is unpickled (PyTorch's "torch.load" security note). The shards (manifest["shards"])
    are the workers' to load (trainer/workers/shard_state.py)."""
    path = Path(path)
    manifest = verify_checkpoint(path, hash_shards=hash_shards)
    shards = shard_files(manifest, path / MANIFEST)
    parts = {
        Path(name).stem: load_torch_file(path / name, map_location) for name in manifest["files"] if name not in shards
    }
    return parts, manifest


def check_trainer_parts(manifest: dict[str, Any], parts: dict[str, Any], manifest_path: Path) -> None:
    """Raise CheckpointError naming what a trainer's resume needs and the manifest lacks: the driver's
    ``trainer.pt`` always, and by format the whole ``model.pt`` and ``optimizer.pt`` (1) or a
    ``shards`` section (2), instead of a KeyError later."""
    version = manifest.get("format_version")
    missing = [f"{name}.pt" for name in ("trainer", *(("model", "optimizer") if version == 1 else ())) if name not in parts]
    if version != 1 and not manifest.get("shards"):
        missing.append('a "shards" section')
    if missing:
        listed = ", ".join(sorted(manifest.get("files", {}))) or "none"
        raise CheckpointError(
            f"{manifest_path}: format_version {version} needs {' and '.join(missing)} to resume a trainer; "
            f"the manifest lists files {listed}"
        )


def latest_checkpoint(root: str | Path) -> Path | None:
    """The step named by the tracker file, if that checkpoint is complete (its manifest valid, every
    file there with its size; the workers' shards are hashed when they are loaded); None when there
    is none."""
    tracker = Path(root) / TRACKER
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    if not text.isdigit():
        raise CheckpointError(f"{tracker}: expected a step number, found {text!r}")
    path = step_dir(root, int(text))
    verify_checkpoint(path, hash_shards=False)  # loading hashes them
    return path
