"""Each worker's own part of the actor's model and optimizer state, saved and loaded without a gather.

A worker writes its files (``shard_file_name``) into the checkpoint's temporary directory: under
FSDP2 the local shards of its parameters and AdamW moments (the rows of dim 0 that
``fully_shard`` gave it), under dp (a full replica on every worker) rank 0's whole state alone.
Its tensors are split into ``FILES_PER_RANK`` files of about equal size, written by as many
threads at once, so that hashing one file overlaps the copy and write of another (file writes and
hashlib release the GIL). The threads copy their tensors to the host one at a time: copies of
pageable memory share one link, so four at once all end together and no file starts to be written
until then; one at a time, the first file is written while the next is copied (profiled by
``benchmarks/checkpoint_profile.py``). A file holds plain tensors and lists only, so it loads with
``torch.load(weights_only=True)``; torch.distributed.checkpoint's FileSystemReader is not used
because it unpickles its ``.metadata`` file with ``pickle.load`` (code could run on load). What each
tensor is goes into the manifest instead, as JSON (``TensorSpan``: its whole shape and dtype, and which rows of dim 0 this file holds).

Loading fills every tensor of this worker, row by row, from whichever files hold those rows: its
own file when the layout is the one that saved (the common case), other ranks' files (memory-mapped,
so only the rows it needs are read) when the world size or the strategy differs. So a checkpoint
of 2 FSDP2 workers loads on 1 or 4, or under dp. Model keys are ``model/<parameter name>``, the
optimizer's ``optimizer/<parameter name>/<state name>`` (names as torch.distributed.checkpoint's
``get_optimizer_state_dict`` gives them, the same with or without FSDP2).
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.checkpoint_files import CheckpointError, load_torch_file, write_torch_file

FILES_PER_RANK = 4


def shard_file_name(world_size: int, rank: int, part: int) -> str:
    # VERL names its per-rank files alike (verl/utils/checkpoint/fsdp_checkpoint_manager.py).
    return f"shard_world_size_{world_size}_rank_{rank}_part_{part}.pt"


def balanced_parts(sizes: dict[str, int], parts: int) -> list[list[str]]:
    """The keys in at most ``parts`` non-empty groups of about equal total size (largest first,
    each to the lightest group so far), each group in the keys' own order."""
    groups: list[list[str]] = [[] for _ in range(parts)]
    totals = [0] * parts
    for key in sorted(sizes, key=lambda k: -sizes[k]):
        lightest = totals.index(min(totals))
        groups[lightest].append(key)
        totals[lightest] += sizes[key]
    order = {key: i for i, key in enumerate(sizes)}
    return [sorted(group, key=order.__getitem__) for group in groups if group]


def tensor_span(value: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    """(this worker's local tensor, its span: whole shape, dtype, offset and rows along dim 0).

    A plain tensor is whole (offset 0); a DTensor must be Shard(0) or Replicate on a 1-D mesh, as
    ``fully_shard`` makes them; its rows are torch.chunk's (ceil(n / world) per rank, the last short)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    shape = list(value.shape)
    rows = shape[0] if shape else 1
    if not isinstance(value, DTensor):
        return value, {"shape": shape, "dtype": str(value.dtype), "offset": 0, "rows": rows}
    local = value.to_local()
    (placement,) = value.placements
    if isinstance(placement, Replicate) or not shape:
        return local, {"shape": shape, "dtype": str(value.dtype), "offset": 0, "rows": rows}
    if not (isinstance(placement, Shard) and placement.dim == 0):
        raise ValueError(f"expected a DTensor sharded on dim 0 or replicated, found placement {placement}")
    chunk = math.ceil(rows / value.device_mesh.size())
    offset = min(value.device_mesh.get_local_rank() * chunk, rows)
    if local.shape[0] != min(chunk, rows - offset):
        raise ValueError(f"local shard of {local.shape[0]} rows, expected torch.chunk's {min(chunk, rows - offset)}")
    return local, {"shape": shape, "dtype": str(value.dtype), "offset": offset, "rows": local.shape[0]}


def _optimizer_state(policy: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state keyed by parameter name, each value this worker's (sharded) tensor."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(policy, optimizer, options=StateDictOptions(full_state_dict=False))


def _named_values(policy: nn.Module, optim_state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Every tensor to save or fill, by checkpoint key (see the module docstring)."""
    out = {f"model/{name}": value for name, value in policy.state_dict().items()}
    for name, values in optim_state["state"].items():
        for key, value in values.items():
            if not isinstance(value, torch.Tensor):
                raise ValueError(f"optimizer state {name}/{key}: expected a tensor, found {type(value).__name__}")
            out[f"optimizer/{name}/{key}"] = value
    return out


def save_shard(
    directory: Path, world_size: int, rank: int, policy: nn.Module, optimizer: torch.optim.Optimizer
) -> list[dict[str, Any]]:
    """Write this worker's state into ``directory``; returns each file's {file, bytes, sha256, tensors: spans}."""
    optim_state = _optimizer_state(policy, optimizer)
    local: dict[str, torch.Tensor] = {}
    spans: dict[str, dict[str, Any]] = {}
    for key, value in _named_values(policy, optim_state).items():
        local[key], spans[key] = tensor_span(value)
    groups = balanced_parts({key: t.numel() * t.element_size() for key, t in local.items()}, FILES_PER_RANK)
    copying = threading.Lock()  # one part's copy to the host at a time (see the module docstring)

    def write(part: int) -> dict[str, Any]:
        name = shard_file_name(world_size, rank, part)
        # A copy on the CPU: a view would save its whole storage (FSDP2 pads its shards).
        with copying:
            tensors = {key: local[key].detach().to("cpu", copy=True) for key in groups[part]}
        info = write_torch_file(directory / name, {"tensors": tensors, "param_groups": optim_state["param_groups"]})
        return {"file": name, **info, "tensors": {key: spans[key] for key in groups[part]}}

    with ThreadPoolExecutor(max_workers=len(groups)) as pool:
        return list(pool.map(write, range(len(groups))))


class ShardSources:
    """The checkpoint's shard files (path, spans), read lazily, memory-mapped, this worker's first."""

    def __init__(self, files: list[tuple[Path, dict[str, dict[str, Any]]]]) -> None:
        self.files = files
        self._open: dict[Path, dict[str, Any]] = {}
        self.used: set[str] = set()

    def payload(self, path: Path) -> dict[str, Any]:
        if path not in self._open:
            self._open[path] = load_torch_file(path, mmap=True)
        return self._open[path]

    def _saved(self, path: Path, key: str, span: dict[str, Any]) -> torch.Tensor:
        payload = self.payload(path)
        tensors = payload.get("tensors") if isinstance(payload, dict) else None
        src = tensors.get(key) if isinstance(tensors, dict) else None
        found = list(src.shape) if isinstance(src, torch.Tensor) else None
        if found is None or found[1:] != span["shape"][1:] or (found[0] if found else 1) != span["rows"]:
            raise CheckpointError(
                f"{path}: {key} should be {span['rows']} rows of {span['shape']} by the manifest, found {found}"
            )
        return src

    def fill(self, key: str, value: torch.Tensor) -> None:
        """Copy the saved rows of ``key`` into this worker's part of ``value``, or raise naming what is missing."""
        dst, want = tensor_span(value)
        covered = torch.zeros(want["rows"], dtype=torch.bool)
        for path, spans in self.files:
            span = spans.get(key)
            if span is None:
                continue
            if (span["shape"], span["dtype"]) != (want["shape"], want["dtype"]):
                raise CheckpointError(
                    f"{path}: {key} was saved as {span['dtype']} {span['shape']}, "
                    f"this model holds {want['dtype']} {want['shape']}"
                )
            lo, hi = max(want["offset"], span["offset"]), min(want["offset"] + want["rows"], span["offset"] + span["rows"])
            if hi <= lo:
                continue
            src = self._saved(path, key, span)
            with torch.no_grad():
                if dst.dim() == 0:
                    dst.copy_(src)
                else:
                    dst[lo - want["offset"] : hi - want["offset"]].copy_(src[lo - span["offset"] : hi - span["offset"]])
            covered[lo - want["offset"] : hi - want["offset"]] = True
            if bool(covered.all()):
                break
        self.used.add(key)
        if not bool(covered.all()):
            raise CheckpointError(f"{key}: rows {want['offset']}..{want['offset'] + want['rows']} are in no shard file")

    def unused(self) -> list[str]:
        saved = {key for _, spans in self.files for key in spans}
        return sorted(saved - self.used)


def load_shards(policy: nn.Module, optimizer: torch.optim.Optimizer, sources: ShardSources) -> None:
    """Fill the model's parameters and the optimizer's state from ``sources``; raise CheckpointError
    for a tensor missing, of another shape or dtype, or saved but unknown to this model."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    optim_state = _optimizer_state(policy, optimizer)  # initialises AdamW's state if it has none yet
    for key, value in _named_values(policy, optim_state).items():
        sources.fill(key, value)
    extra = sources.unused()
    if extra:
        raise CheckpointError(f"the checkpoint holds state this model does not: {extra[:5]} ({len(extra)} keys)")
    path = sources.files[0][0]
    payload = sources.payload(path)
    saved_groups = payload.get("param_groups") if isinstance(payload, dict) else None
    names = [group["params"] for group in optim_state["param_groups"]]
    saved_names = [g.get("params") for g in saved_groups if isinstance(g, dict)] if isinstance(saved_groups, list) else None
    if saved_names != names:
        raise CheckpointError(f"{path}: expected the optimizer's parameter groups of this model's parameters, found {saved_names!r:.200}")
    optim_state["param_groups"] = saved_groups
    set_optimizer_state_dict(policy, optimizer, optim_state, options=StateDictOptions(full_state_dict=False))
