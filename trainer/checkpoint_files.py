"""One checkpoint file: written durably with its SHA-256 taken on the way, checked against the
manifest before it is read, and read with ``torch.load(weights_only=True)``.

Shared by the driver (its own part, ``trainer.pt``) and the workers (their shards of model and
optimizer state, trainer/workers/shard_state.py), so that neither side reads a file twice to hash it.
Loading allows tensors, numbers, strings and plain containers only, so a crafted file cannot run
code while it is unpickled (PyTorch's "torch.load" security note).
"""

from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path
from typing import Any

import torch


class CheckpointError(RuntimeError):
    """A checkpoint directory is missing, incomplete or corrupt; the message names the file."""


class _HashingWriter:
    """A file-like object for torch.save that hashes and counts every byte it passes to ``fh``."""

    def __init__(self, fh: Any) -> None:
        self.fh = fh
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.digest.update(view)
        self.size += view.nbytes
        return self.fh.write(view)

    def flush(self) -> None:
        self.fh.flush()


def write_torch_file(path: Path, obj: Any) -> dict[str, Any]:
    """torch.save ``obj`` to ``path``, flushed to disk; returns its manifest entry {bytes, sha256}."""
    with path.open("wb") as fh:
        writer = _HashingWriter(fh)
        torch.save(obj, writer)
        fh.flush()
        os.fsync(fh.fileno())
    return {"bytes": writer.size, "sha256": writer.digest.hexdigest()}


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_file(path: Path, info: dict[str, Any], hash_bytes: bool = True) -> None:
    """Raise CheckpointError naming ``path`` unless it exists with the manifest's size (and SHA-256)."""
    if not path.is_file():
        raise CheckpointError(f"{path}: listed in the manifest but missing")
    if path.stat().st_size != info["bytes"] or (hash_bytes and sha256_file(path) != info["sha256"]):
        raise CheckpointError(f"{path}: size or SHA-256 differs from the manifest (corrupt)")


def load_torch_file(path: Path, map_location: str | torch.device = "cpu", mmap: bool = False) -> Any:
    """``torch.load(weights_only=True)``; a file holding other objects is a CheckpointError naming it.

    mmap maps the file instead of reading it whole (a worker takes only its rows from other shards)."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{path}: expected only tensors and plain containers (torch.load weights_only=True), "
            f"found other objects: {_refusal_reason(exc)}"
        ) from exc


def _refusal_reason(exc: pickle.UnpicklingError) -> str:
    # torch's message opens with advice to retry with weights_only=False; name the object instead.
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    named = [line for line in lines if "GLOBAL" in line or "Unsupported" in line]
    return (named or lines or [type(exc).__name__])[0]
