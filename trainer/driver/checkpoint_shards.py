"""The manifest's ``shards`` section: which files the workers wrote and what each tensor in them is.

::

    "shards": {"strategy": "fsdp2", "world_size": 2,
               "files": {"shard_world_size_2_rank_0_part_0.pt": {"rank": 0, "tensors": {KEY: SPAN, ...}},
                         ...}}

KEY and SPAN are trainer/workers/shard_state.py's (a SPAN: whole ``shape``, ``dtype``, and the
``offset`` and ``rows`` of dim 0 the file holds). Each file's size and SHA-256 are in the manifest's
``files`` like any other file's; this section only says what is inside. It is read from a file
that may have been edited, so every field is checked and a bad one named before a worker reads a byte.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.checkpoint_files import CheckpointError

SHARDS = "shards"
SPAN_FIELDS = ("shape", "dtype", "offset", "rows")


def shard_section(reports: list[list[dict[str, Any]]], strategy: str, world_size: int) -> dict[str, Any]:
    """What ``save_checkpoint``'s ``write_shards`` returns, from each worker's ``save_shard`` reports,
    one per file it wrote (none from a worker that wrote nothing: under dp only rank 0 writes)."""
    files: dict[str, dict[str, Any]] = {}
    described: dict[str, dict[str, Any]] = {}
    for rank, worker_files in enumerate(reports):
        for report in worker_files:
            files[report["file"]] = {"bytes": report["bytes"], "sha256": report["sha256"]}
            described[report["file"]] = {"rank": rank, "tensors": report["tensors"]}
    return {"files": files, SHARDS: {"strategy": strategy, "world_size": world_size, "files": described}}


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _span_problem(span: Any) -> str | None:
    if not isinstance(span, dict) or set(span) != set(SPAN_FIELDS):
        return f"expected a mapping of {', '.join(SPAN_FIELDS)}, found {span!r}"
    shape, offset, rows = span["shape"], span["offset"], span["rows"]
    if not (isinstance(shape, list) and all(_is_count(n) for n in shape)) or not isinstance(span["dtype"], str):
        return f"expected a shape of counts and a dtype name, found {shape!r} and {span['dtype']!r}"
    whole = shape[0] if shape else 1
    if not (_is_count(offset) and _is_count(rows) and offset + rows <= whole):
        return f"expected offset and rows within the {whole} rows of dim 0, found offset {offset!r}, rows {rows!r}"
    return None


def shard_files(manifest: dict[str, Any], manifest_path: Path) -> dict[str, dict[str, Any]]:
    """The manifest's shard files (name -> {rank, tensors}), {} when it has none (a checkpoint of the
    driver's parts only, or of format 1), or CheckpointError naming the field that is wrong."""
    section = manifest.get(SHARDS)
    if section is None:
        return {}
    where = f"{manifest_path}: field '{SHARDS}'"
    if not isinstance(section, dict) or not {"strategy", "world_size", "files"} <= set(section):
        raise CheckpointError(f"{where}: expected a mapping of strategy, world_size and files, found {section!r:.200}")
    world = section["world_size"]
    if not (_is_count(world) and world >= 1):
        raise CheckpointError(f"{where}: expected world_size to be a number of workers, found {world!r}")
    files = section["files"]
    if not isinstance(files, dict) or not files:
        raise CheckpointError(f"{where}: expected 'files' to map at least one file to its rank and tensors")
    listed = manifest.get("files") or {}
    for name, entry in files.items():
        if name not in listed:
            raise CheckpointError(f"{where}: file {name!r} is not listed under 'files' (no size or SHA-256)")
        if not isinstance(entry, dict) or not isinstance(entry.get("tensors"), dict):
            raise CheckpointError(f"{where}: expected {name!r} to map to a rank and tensors, found {entry!r:.200}")
        rank = entry.get("rank")
        if not (_is_count(rank) and rank < world):
            raise CheckpointError(f"{where}: expected {name!r}'s rank in 0..{world - 1}, found {rank!r}")
        for key, span in entry["tensors"].items():
            problem = _span_problem(span)
            if problem:
                raise CheckpointError(f"{where}: {name!r} tensor {key!r}: {problem}")
    return files


def write_shards(workers: Any, directory: Path) -> dict[str, Any]:
    """Every worker writes its shard into ``directory`` at once (a ``save_checkpoint`` ShardWriter)."""
    reports = workers.all("save_shard", str(directory), phase="save_checkpoint")
    return shard_section(reports, workers.info[0]["strategy"], workers.world_size)


def load_shards(workers: Any, directory: Path, files: dict[str, dict[str, Any]], listed: dict[str, Any]) -> None:
    """Hash every shard file (each worker a share, in parallel), then have each worker fill its
    model and optimizer from them; CheckpointError naming the first file that fails."""
    names = sorted(files)
    world = workers.world_size
    shares = [([(str(directory / n), listed[n]) for n in names[rank::world]],) for rank in range(world)]
    _raise_first(workers.each("verify_files", shares, phase="load_checkpoint"))
    per_rank = [([(str(path), spans) for path, spans in sources_for(directory, files, rank)],) for rank in range(world)]
    _raise_first([[e] if e else [] for e in workers.each("load_shards", per_rank, phase="load_checkpoint")])


def _raise_first(problems_per_worker: list[list[str]]) -> None:
    problems = [p for problems in problems_per_worker for p in problems]
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise CheckpointError(problems[0] + more)


def sources_for(directory: Path, files: dict[str, dict[str, Any]], rank: int) -> list[tuple[Path, dict[str, Any]]]:
    """The shard files a worker of ``rank`` reads from, (path, tensor spans), its own rank's first."""
    order = sorted(files, key=lambda name: (files[name]["rank"] != rank, files[name]["rank"], name))
    return [(directory / name, files[name]["tensors"]) for name in order]
