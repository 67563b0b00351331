"""Where a sharded checkpoint save spends its time, stage by stage, and the disk's own ceiling.

    python benchmarks/checkpoint_profile.py OUT.json --ranks 1 --dir /tmp/ckpt-profile

The suites time ``save_checkpoint`` as a whole (``bash benchmarks/gpu_suites.sh OUT save16x8``).
This script takes one rank's share of the 1.5B model's state (the parameters and AdamW's two
moments in the model's dtype, split by ``--ranks`` as FSDP2 splits them) and saves it as
``trainer/workers/shard_state.py`` does: ``FILES_PER_RANK`` threads, each copying its tensors to
the CPU (one thread at a time, or all at once as before) and writing them with
``trainer.checkpoint_files.write_torch_file``'s hashing writer, then fsync. It times each stage of each thread, then the ceilings the stages share: the disk alone
(the same bytes written raw and fsynced, one thread and ``FILES_PER_RANK`` threads), SHA-256 alone,
and the device-to-host copy alone (pageable, as the save does, and pinned).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

import torch  # noqa: E402

from trainer.checkpoint_files import _HashingWriter  # noqa: E402
from trainer.models.presets import preset_config  # noqa: E402
from trainer.workers.shard_state import FILES_PER_RANK, balanced_parts  # noqa: E402

GB = 1e9


def log(*args: Any) -> None:
    print(*args, flush=True)


def rank_state(preset: str, ranks: int, device: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One rank's rows of every parameter and of AdamW's exp_avg and exp_avg_sq (dim 0 split by
    ``ranks``, as fully_shard splits it), random values, on ``device``."""
    cfg = preset_config(preset)
    with torch.device("meta"):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_config(cfg)
    out = {}
    for name, p in model.state_dict().items():
        rows = -(-p.shape[0] // ranks) if p.dim() else 1
        shape = (rows, *p.shape[1:]) if p.dim() else ()
        for key in (f"model/{name}", f"optimizer/{name}/exp_avg", f"optimizer/{name}/exp_avg_sq"):
            out[key] = torch.randn(shape, device=device, dtype=torch.float32).to(dtype)
    return out


def save_like_a_rank(
    state: dict[str, torch.Tensor], directory: Path, one_copy_at_a_time: bool = True, pinned: bool = False
) -> list[dict[str, float]]:
    """shard_state.save_shard's work, with each stage of each file timed. ``one_copy_at_a_time``:
    the threads take turns copying to the host, as save_shard does (False: all copy at once, as it
    did before); ``pinned`` copies into page-locked host buffers allocated for the purpose (their
    allocation counted in the copy)."""
    groups = balanced_parts({k: t.numel() * t.element_size() for k, t in state.items()}, FILES_PER_RANK)
    copying = threading.Lock() if one_copy_at_a_time else contextlib.nullcontext()

    def copy_to_host(part: int) -> dict[str, torch.Tensor]:
        if not pinned:
            return {key: state[key].detach().to("cpu", copy=True) for key in groups[part]}
        out = {key: torch.empty(state[key].shape, dtype=state[key].dtype, pin_memory=True) for key in groups[part]}
        for key in groups[part]:
            out[key].copy_(state[key].detach())
        return out

    def write(part: int) -> dict[str, float]:
        start = time.perf_counter()
        with copying:
            t0 = time.perf_counter()
            tensors = copy_to_host(part)
            t1 = time.perf_counter()
        with (directory / f"part_{part}.pt").open("wb") as fh:
            writer = _HashingWriter(fh)
            torch.save({"tensors": tensors}, writer)
            fh.flush()
            t2 = time.perf_counter()
            os.fsync(fh.fileno())
        t3 = time.perf_counter()
        return {"bytes": writer.size, "wait_s": t0 - start, "copy_s": t1 - t0, "save_hash_write_s": t2 - t1,
                "fsync_s": t3 - t2, "total_s": t3 - start}

    with ThreadPoolExecutor(max_workers=len(groups)) as pool:
        return list(pool.map(write, range(len(groups))))


def raw_write(directory: Path, total: int, threads: int, block: int = 64 << 20) -> float:
    """GB/s for ``total`` bytes written by ``threads`` threads in ``block`` writes, each file fsynced."""
    buf = os.urandom(block)

    def one(i: int) -> None:
        left = total // threads
        with (directory / f"raw_{i}").open("wb") as fh:
            while left > 0:
                left -= fh.write(buf[: min(block, left)])
            fh.flush()
            os.fsync(fh.fileno())

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(one, range(threads)))
    return total / (time.perf_counter() - start) / GB


def sha256_rate(nbytes: int, threads: int) -> float:
    """GB/s of SHA-256 over ``nbytes`` split across ``threads`` threads (hashlib releases the GIL)."""
    buf = memoryview(os.urandom(64 << 20))

    def one(_: int) -> None:
        digest, left = hashlib.sha256(), nbytes // threads
        while left > 0:
            digest.update(buf[: min(len(buf), left)])
            left -= len(buf)

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(one, range(threads)))
    return nbytes / (time.perf_counter() - start) / GB


def copy_rate(state: dict[str, torch.Tensor], pinned: bool) -> float:
    """GB/s of copying every tensor of ``state`` to the host, pageable (as the save does) or pinned."""
    total = sum(t.numel() * t.element_size() for t in state.values())
    dst = {k: torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for k, t in state.items()} if pinned else None
    torch.cuda.synchronize()
    start = time.perf_counter()
    for k, t in state.items():
        if dst is None:
            t.to("cpu", copy=True)
        else:
            dst[k].copy_(t, non_blocking=True)
    torch.cuda.synchronize()
    return total / (time.perf_counter() - start) / GB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="JSON file for the figures")
    ap.add_argument("--preset", default="r1-distill-qwen-1.5b")
    ap.add_argument("--ranks", type=int, default=1, help="the data-parallel size whose one rank's share is saved")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/rlbench-ckpt-profile"), help="scratch directory (removed)")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args.dir.mkdir(parents=True, exist_ok=True)
    try:
        state = rank_state(args.preset, args.ranks, device, getattr(torch, args.dtype))
        total = sum(t.numel() * t.element_size() for t in state.values())
        log(f"{len(state)} tensors, {total / GB:.2f} GB on {device}")
        result: dict[str, Any] = {"preset": args.preset, "ranks": args.ranks, "dtype": args.dtype, "bytes": total,
                                  "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                                  "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d")}
        saves = []
        for one_at_a_time in (False, True, False, True):
            start = time.perf_counter()
            parts = save_like_a_rank(state, args.dir, one_at_a_time)
            saves.append({"one_copy_at_a_time": one_at_a_time, "seconds": time.perf_counter() - start, "parts": parts})
            log(f"save (one copy at a time: {one_at_a_time}): {saves[-1]['seconds']:.2f} s",
                [{k: round(v, 2) for k, v in p.items() if k != "bytes"} for p in parts])
        result["save"] = saves
        for p in args.dir.glob("part_*.pt"):
            p.unlink()
        result["disk_write_gbps"] = {str(n): raw_write(args.dir, total, n) for n in (1, FILES_PER_RANK)}
        log("raw write + fsync GB/s:", result["disk_write_gbps"])
        result["sha256_gbps"] = {str(n): sha256_rate(min(total, 4 << 30), n) for n in (1, FILES_PER_RANK)}
        log("sha256 GB/s:", result["sha256_gbps"])
        if device == "cuda":
            result["d2h_gbps"] = {"pageable": copy_rate(state, False), "pinned": copy_rate(state, True)}
            log("device to host GB/s:", result["d2h_gbps"])
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
