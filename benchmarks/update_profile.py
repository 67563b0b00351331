"""Where the training phases' time goes on one GPU: the GPU busy, or waiting on its host (issue 31).

    python benchmarks/update_profile.py OUT_DIR [--rounds 3] [--phases old_log_prob ref update_actor]
                                                [--config KEY=VALUE ...] [--world 1]

One training worker (trainer/workers/train_worker.py, as a session builds it, without Ray: FSDP2 over
a group of one; with ``--world N``, N workers, one a GPU, each in its own process and with its own
batch of the shape and, as a Ray worker has, one OpenMP thread unless OMP_NUM_THREADS says otherwise,
FSDP2 over all of them, each writing its own results) at step16x8's shape by default (16 prompts x 8, prompt 256 + response 1024, the 1.5B
preset, use_liger, the KL loss; ``--config`` adds or replaces keys). It generates one batch with its
own rollout engine (or, with ``--response-lengths``, makes rows of those lengths without decoding), then
records each phase's first call (after the worker's set-up, which on GPU warms the training phases'
kernels since 2026-11-29: trainer/workers/training_warm_up.py; earlier first-call figures in
docs/benchmarks.md predate it) and times each phase ``--rounds`` times on that batch (as the suites time them,
the device synchronised at the end), with NVML sampling the GPU: SM clock, power and how often the
power cap held the clock back. Then it runs each phase once more under torch's profiler and reads
the trace: how long the GPU ran kernels (the union of their intervals) against the call's wall time,
and every stretch longer than 10 microseconds in which the GPU ran nothing, filed under the host
call that launched the kernel after it (the host was late) and whether the host had just waited on
the GPU (a sync drains the queue, and the GPU idles until the host launches again). The profiler
slows the host, so the profiled call's gaps bound the timed calls' from above. The trace's summary
also splits the GPU's busy time by kernel family (matmul, attention, NCCL, the foreach kernels of AdamW
and of gradient clipping, copies, the rest) and names the kernels that took longest; each phase's row has its peak memory, from the timed
rounds. ``--profile-first`` profiles each phase's first call instead (what a session's first step still pays).

Results: OUT_DIR/update_profile.json (``_rankR`` before the suffix with ``--world``); the profiled traces (chrome format, gzip) beside it, which
``python benchmarks/update_profile.py --read TRACE.json.gz`` summarises again. Runs on a CPU too (with
``--config trainer.device=cpu`` and a small model), where there is no GPU trace to read.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

STEP16X8 = [
    "actor_rollout_ref.model.path=r1-distill-qwen-1.5b",
    "trainer.device=cuda",
    "actor_rollout_ref.rollout.name=fast",
    "data.max_prompt_length=256",
    "data.max_response_length=1024",
    "actor_rollout_ref.rollout.ignore_eos=True",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.rollout.n=8",
    "data.train_batch_size=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.model.use_liger=True",
]
GAP_US = 10.0  # a GPU pause shorter than this is the kernels' own turnaround, not a wait
SYNC_NAMES = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def gpu_intervals(events: list[dict]) -> list[tuple[float, float, int]]:
    """(start, end, correlation) of every kernel, copy and fill on the GPU, by start (microseconds)."""
    out = [
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), int(e.get("args", {}).get("correlation", -1)))
        for e in events
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    return sorted(out)


def busy_and_gaps(intervals: list[tuple[float, float, int]]) -> tuple[float, list[tuple[float, float, int]]]:
    """The union of the intervals' lengths, and each pause between them: (start, length, correlation
    of the work that ended it)."""
    busy, gaps = 0.0, []
    end = None
    for start, stop, corr in intervals:
        if end is None:
            busy += stop - start
            end = stop
            continue
        if start > end:
            if start - end >= GAP_US:
                gaps.append((end, start - end, corr))
            busy += stop - start
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    return busy, gaps


def innermost_op(cpu_ops: list[dict], starts: list[float], tid: int, at: float, look_back: int = 5000) -> str:
    """The name of the innermost op of host thread ``tid`` running at ``at``: ops nest, so the latest
    started op of that thread that has not ended by ``at`` (``starts``: the ops' start times, sorted
    as ``cpu_ops``)."""
    i = bisect.bisect_right(starts, at)
    for e in reversed(cpu_ops[max(0, i - look_back) : i]):
        if e["tid"] == tid and e["ts"] + e.get("dur", 0.0) >= at:
            return e["name"]
    return "(no op: Python between ops)"


def top_level_ops(cpu_ops: list[dict]) -> dict[int, tuple[list[dict], list[float]]]:
    """Per host thread, its outermost ops (those no other op of the thread encloses) and their starts:
    what the host was busy with (a layer's forward, an autograd node's backward) at a moment."""
    by_thread: dict[int, list[dict]] = defaultdict(list)
    for e in cpu_ops:
        by_thread[e["tid"]].append(e)
    out = {}
    for tid, ops in by_thread.items():
        ops.sort(key=lambda e: (e["ts"], -e.get("dur", 0.0)))
        top, end = [], float("-inf")
        for e in ops:
            if e["ts"] >= end:
                top.append(e)
                end = e["ts"] + e.get("dur", 0.0)
        out[tid] = (top, [e["ts"] for e in top])
    return out


def outermost_op(tops: dict[int, tuple[list[dict], list[float]]], tid: int, at: float) -> str:
    top, starts = tops.get(tid, ([], []))
    i = bisect.bisect_right(starts, at) - 1
    if i >= 0 and top[i]["ts"] + top[i].get("dur", 0.0) >= at:
        return top[i]["name"]
    return "(between ops: Python)"


def _largest_seconds(pauses: dict[str, list[float]], most: int = 20) -> dict[str, float]:
    """The ``most`` names with the longest pauses in all, in seconds, longest first."""
    totals = sorted(((name, sum(us) / 1e6) for name, us in pauses.items()), key=lambda kv: -kv[1])
    return dict(totals[:most])


KERNEL_FAMILIES = (  # (family, name fragments), first match wins; names are lower-cased
    ("nccl", ("nccl",)),
    ("attention", ("flash", "fmha", "attn")),
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "sm90_", "sm80_")),
    ("foreach", ("multi_tensor", "adam", "foreach")),  # AdamW's, and gradient clipping's and zeroing's
    ("copy", ("memcpy", "memset")),
)


def kernel_family(name: str) -> str:
    low = name.lower()
    for family, fragments in KERNEL_FAMILIES:
        if any(f in low for f in fragments):
            return family
    return "other"


def kernel_seconds(events: list[dict], most: int = 25) -> dict[str, Any]:
    """The GPU's time by kernel family and the ``most`` kernels (by name, cut to 90 characters) that
    took longest in all: where a busy GPU's time went."""
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            entry = by_name[e["name"][:90]]
            entry[0] += float(e.get("dur", 0.0)) / 1e6
            entry[1] += 1
    families: dict[str, float] = defaultdict(float)
    for name, (seconds, _) in by_name.items():
        families[kernel_family(name)] += seconds
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:most]
    return {
        "family_s": dict(sorted(families.items(), key=lambda kv: -kv[1])),
        "top_kernels": [{"name": n, "s": round(s, 4), "count": c} for n, (s, c) in top],
    }


def read_trace(path: Path) -> dict[str, Any]:
    """The trace's summary (a chrome trace, gzip or not): GPU busy time against the wall, the pauses
    filed by cause."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    # the launches: the CUDA runtime's calls, and the driver's (Triton's kernels: liger-kernel's, ours)
    runtime = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")]
    cpu_ops = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
    launch_of = {int(e.get("args", {}).get("correlation", -1)): e for e in runtime}
    intervals = gpu_intervals(events)
    if not intervals:
        return {"kernels": 0}
    busy, gaps = busy_and_gaps(intervals)
    begin = min(e["ts"] for e in cpu_ops) if cpu_ops else intervals[0][0]
    gpu_end = max(i[1] for i in intervals)
    wall = max(gpu_end, max((e["ts"] + e.get("dur", 0.0) for e in cpu_ops), default=0.0)) - begin
    sync_calls = [e for e in runtime if e["name"] in SYNC_NAMES]
    runtime_calls: dict[str, list[float]] = defaultdict(list)
    for e in runtime:
        runtime_calls[e["name"]].append(float(e.get("dur", 0.0)))
    # the host's waits on the GPU: the sync calls, and copies long enough to have blocked
    waits = sync_calls + [e for e in runtime if e["name"].startswith("cudaMemcpy") and e.get("dur", 0) > 20]
    wait_ends = sorted(e["ts"] + e.get("dur", 0.0) for e in waits)
    by_op: dict[str, list[float]] = defaultdict(list)
    by_top: dict[str, list[float]] = defaultdict(list)
    tops = top_level_ops(cpu_ops)
    after_sync = 0.0
    top = []
    starts = [e["ts"] for e in cpu_ops]
    for start, length, corr in gaps:
        launch = launch_of.get(corr)
        at = launch["ts"] if launch else start + length
        name = innermost_op(cpu_ops, starts, launch["tid"], at) if launch else "(no launch found)"
        i = bisect.bisect_right(wait_ends, at)
        waited = i > 0 and wait_ends[i - 1] >= start - 1.0  # the host came back from a wait inside this pause
        if waited:
            after_sync += length
        by_op[name].append(length)
        by_top[outermost_op(tops, launch["tid"], at) if launch else "(no launch found)"].append(length)
        top.append((length, name, waited))
    top.sort(reverse=True)
    syncs_by_op: dict[str, int] = defaultdict(int)
    for e in sync_calls:
        syncs_by_op[outermost_op(tops, e["tid"], e["ts"])] += 1
    sizes = {"10-50us": (10, 50), "50-200us": (50, 200), "200us-1ms": (200, 1000), ">1ms": (1000, float("inf"))}
    return {
        "wall_s": wall / 1e6,
        "gpu_busy_s": busy / 1e6,
        "gpu_busy_fraction": busy / wall,
        "gpu_work_items": len(intervals),
        "launch_calls": sum(1 for e in runtime if "Launch" in e["name"]),
        "syncs": len(sync_calls),
        "syncs_by_outermost_op": dict(sorted(syncs_by_op.items(), key=lambda kv: -kv[1])),
        "host_blocked_in_syncs_s": sum(e.get("dur", 0.0) for e in sync_calls) / 1e6,
        # a copy from pageable host memory may block the host without a sync call: counted apart
        "pageable_copies": sum(
            1 for e in events if e.get("ph") == "X" and e.get("cat") == "gpu_memcpy" and "Pageable" in e["name"]
        ),
        # the GPU idle between the call's first host op and its first work, and after its last work
        "idle_at_the_ends_s": max(0.0, intervals[0][0] - begin) / 1e6
        + max(0.0, wall - (gpu_end - begin)) / 1e6,
        "gaps": len(gaps),
        "gap_s": sum(g[1] for g in gaps) / 1e6,
        "gap_after_a_sync_s": after_sync / 1e6,
        "gaps_by_length": {
            label: [sum(1 for g in gaps if lo <= g[1] < hi), sum(g[1] for g in gaps if lo <= g[1] < hi) / 1e6]
            for label, (lo, hi) in sizes.items()
        },
        "gap_s_by_launching_op": _largest_seconds(by_op),
        "gap_s_by_outermost_op": _largest_seconds(by_top),
        "longest_gaps": [{"us": round(n, 1), "launched_in": op, "after_sync": w} for n, op, w in top[:15]],
        "kernels_by_time": kernel_seconds(events),
        # the host's CUDA calls that took longest in all (a first call's allocations: cudaMalloc, cudaHostAlloc)
        "runtime_s_by_call": _largest_seconds(runtime_calls, most=12),
    }


def fabricated_batch(lengths: list[int], prompt_length: int, n: int, vocab: int, gen: torch.Generator):
    """Rows of the given response lengths, random ids, full prompts: the training phases' work for
    rows a run generated (their values do not change a phase's work), without decoding them."""
    from trainer.workers.training_warm_up import rows_of_lengths

    rows = len(lengths)
    if rows % n:
        raise SystemExit(f"--response-lengths: {rows} rows do not make whole groups of rollout.n={n}")
    if min(lengths) < 1:
        raise SystemExit(f"--response-lengths: a row of {min(lengths)} tokens; each needs at least 1")
    return rows_of_lengths(lengths, prompt_length, vocab, gen, uids=torch.arange(rows) // n)


def spawn_workers(world: int) -> int:
    """Run this script once per GPU as worker r of ``world`` (the r-th of the GPUs this process may
    use, one process group on a free local port); the exit status: 0, or the first failure's, the
    other workers stopped then (they would wait in a collective for ever)."""
    import os
    import socket
    import subprocess
    import sys

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count() or world)]
    if len(devices) < world:
        raise SystemExit(f"--world {world}: only {len(devices)} GPUs are visible ({', '.join(devices) or 'none'})")
    with socket.socket() as probe:  # a free port for rank 0's store (released here, bound again there)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    procs = [
        subprocess.Popen(
            [sys.executable, *sys.argv, "--rank", str(r), "--port", str(port)],
            # one OpenMP thread each unless told otherwise, as Ray gives a worker of num_cpus=1
            # (ray/_private/utils.py, set_omp_num_threads_if_unset): four workers of 64 threads each on a
            # 64-core host spun on each other's cores, and old_log_prob took 5.3 s instead of 2.2 s
            env={**os.environ, "CUDA_VISIBLE_DEVICES": devices[r], "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
        )
        for r in range(world)
    ]
    while True:
        codes = [p.poll() for p in procs]
        failed = next((c for c in codes if c), 0)
        if failed or all(c == 0 for c in codes):
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            return failed
        time.sleep(1.0)


def profiled_call(call, trace: Path) -> tuple[dict[str, Any], float, Any]:
    """Run ``call`` once under torch's profiler; its trace written gzipped at ``trace`` + .gz, and (its
    summary, the call's seconds, what the call returned)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        returned = call()
        sync()
        seconds = time.perf_counter() - start
    prof.export_chrome_trace(str(trace))
    with open(trace, "rb") as src, gzip.open(str(trace) + ".gz", "wb") as dst:
        dst.write(src.read())
    trace.unlink()
    return read_trace(Path(str(trace) + ".gz")), seconds, returned


def host_pinning() -> tuple[int, float]:
    """(blocks torch's caching host allocator has pinned, seconds spent pinning them) so far; zeros
    without CUDA."""
    read = getattr(torch.cuda, "host_memory_stats", None)  # torch 2.6 and later
    if not torch.cuda.is_available() or read is None:
        return 0, 0.0
    stats = read()
    return int(stats.get("num_host_alloc", 0)), float(stats.get("host_alloc_time.total", 0)) / 1e6


def pinning_delta(before: tuple[int, float], after: tuple[int, float]) -> dict[str, float]:
    return {"blocks": after[0] - before[0], "seconds": round(after[1] - before[1], 3)}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", default="update_profile_out")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--phases", nargs="+", default=["old_log_prob", "ref", "update_actor"],
                    choices=["old_log_prob", "ref", "update_actor"])
    ap.add_argument("--config", nargs="*", default=[], help="KEY=VALUE overrides after step16x8's")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--profile-first", action="store_true",
                    help="profile each phase's first call (after set-up's warm-ups) instead of one after the timed rounds")
    ap.add_argument("--read", nargs="+", default=None, metavar="TRACE", help="only summarise these traces")
    ap.add_argument("--response-lengths", type=int, nargs="+", default=None, metavar="N",
                    help="skip generation: rows of these response lengths (random ids; GRPO groups of rollout.n in order)")
    ap.add_argument("--mini-batches", type=int, default=None,
                    help="optimizer steps per update_actor call (default: train_batch_size / ppo_mini_batch_size)")
    ap.add_argument("--world", type=int, default=1,
                    help="workers, one a GPU (FSDP2 over them all, as a session of this many GPUs); each gets the shape's batch")
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)  # a worker of --world, started by the first
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.read:
        print(json.dumps({Path(path).name: read_trace(Path(path)) for path in args.read}, indent=1))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.world > 1 and args.rank is None:
        raise SystemExit(spawn_workers(args.world))
    rank = args.rank or 0
    suffix = f"_rank{rank}" if args.world > 1 else ""

    from pytest_rlbench.session.gpu_watch import GpuWatch
    from pytest_rlbench.verdict.machine_load import POWER_REASONS, throttle_names
    from trainer.algorithms.advantages import compute_advantage
    from trainer.config import build_config
    from trainer.workers.train_worker import TrainWorker

    cfg = build_config(STEP16X8 + list(args.config))
    worker = TrainWorker(cfg, rank=rank, world_size=args.world)
    host, port = worker.address() if args.world == 1 else ("127.0.0.1", args.port)
    info = worker.setup(host, port)
    prompts = cfg.data.train_batch_size
    gen = torch.Generator().manual_seed(rank)  # each worker its own prompts (and rows), as a step's shards
    vocab = len(worker.tokenizer)  # random ids among the tokenizer's: the engine embeds them as any prompt
    prompt_ids = [torch.randint(0, vocab, (cfg.data.max_prompt_length,), generator=gen).tolist() for _ in range(prompts)]
    t0 = time.perf_counter()
    if args.response_lengths:
        if max(args.response_lengths) > cfg.data.max_response_length:
            raise SystemExit(f"--response-lengths: {max(args.response_lengths)} tokens is more than "
                             f"data.max_response_length={cfg.data.max_response_length}")
        batch = fabricated_batch(args.response_lengths, cfg.data.max_prompt_length, cfg.actor_rollout_ref.rollout.n,
                                 vocab, gen)
    else:
        batch = worker.generate(prompt_ids, list(range(prompts)), [""] * prompts, seed=0)
    gen_s = time.perf_counter() - t0
    batch.token_level_scores = torch.zeros(batch.response_ids.shape)
    last = batch.response_mask.sum(1).clamp(min=1) - 1
    batch.token_level_scores[torch.arange(batch.size), last] = torch.randint(0, 2, (batch.size,), generator=gen).float()
    batch.token_level_rewards = batch.token_level_scores
    # each phase's first call: what set-up's warm-ups left cold (the host allocator's pinned pool, AdamW's state), as in
    # a step that is the process's first; old_log_prob's and ref's are the calls that fill the batch
    first_calls: dict[str, dict[str, Any]] = {}

    def first_call(phase: str, call):
        pinned_before, start, summary = host_pinning(), time.perf_counter(), None
        if args.profile_first:
            summary, _, result = profiled_call(call, out / f"trace_{phase}_first{suffix}.json")
        else:
            result = call()
            sync()
        first_calls[phase] = {"s": time.perf_counter() - start, "pinning": pinning_delta(pinned_before, host_pinning()),
                              "trace": summary}
        return result

    batch.old_log_probs = first_call("old_log_prob", lambda: worker.compute_old_log_prob(batch))
    batch.ref_log_probs = first_call("ref", lambda: worker.compute_ref_log_prob(batch))
    alg = cfg.algorithm
    batch.advantages, batch.returns = compute_advantage(
        alg.adv_estimator, token_level_rewards=batch.token_level_rewards, response_mask=batch.response_mask,
        index=batch.uids.tolist(), gamma=alg.gamma, lam=alg.lam, norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo,
    )
    n_mini = args.mini_batches or cfg.data.train_batch_size // cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    calls = {
        "old_log_prob": lambda: worker.compute_old_log_prob(batch),
        "ref": lambda: worker.compute_ref_log_prob(batch),
        "update_actor": lambda: worker.update_actor(batch, n_mini),
    }
    watch = GpuWatch([info["gpu_uuid"]] if info["gpu_uuid"] else [], interval_s=0.01)
    watch.start()
    result: dict[str, Any] = {
        "gpu": info["device_name"], "worker": info, "world": args.world, "rank": rank,
        "config": STEP16X8 + list(args.config),
        "rows": batch.size, "response_tokens": int(batch.response_mask.sum()), "generate_s": gen_s, "phases": {},
    }
    for phase in args.phases:
        call = calls[phase]
        if phase not in first_calls:
            first_call(phase, call)
        else:
            call()  # a second call, as the timed rounds are: update_actor's first call was its own
            sync()
        pinned_first = host_pinning()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        seconds, telemetry = [], []
        for _ in range(args.rounds):
            watch.mark_start()
            start = time.perf_counter()
            call()
            sync()
            seconds.append(time.perf_counter() - start)
            watch.mark_end()
        pinned_after = host_pinning()
        since = watch._marks[-args.rounds][0] if watch.available else float("inf")
        samples = [s for s in watch._samples if since <= s.t]
        capped = sum(1 for s in samples if POWER_REASONS & set(throttle_names(s.reasons)))
        for r in watch.rounds(skip=len(watch._marks) - args.rounds) if watch.available else []:
            telemetry.append({"sm_mhz": r.sm_clock_mhz, "power_w": round(r.power_w, 1), "cap_w": r.power_cap_w,
                              "throttle": list(r.throttle)})
        row: dict[str, Any] = {
            "first_call_s": first_calls[phase]["s"], "seconds": seconds, "median_s": statistics.median(seconds), "rounds": telemetry,
            "samples": len(samples), "power_capped_fraction": capped / max(len(samples), 1),
            # new page-locked host blocks and the seconds spent pinning them (torch's caching host
            # allocator): in the phase's first call, and in the timed rounds
            "host_pinning_first": first_calls[phase]["pinning"],
            "host_pinning_rounds": pinning_delta(pinned_first, pinned_after),
        }
        if torch.cuda.is_available():
            row["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
            row["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
        if first_calls[phase]["trace"] is not None:
            row["trace_first_call"] = first_calls[phase]["trace"]
        elif not args.no_profile:
            row["trace"], row["profiled_s"], _ = profiled_call(call, out / f"trace_{phase}{suffix}.json")
        result["phases"][phase] = row
        print(json.dumps({phase: row}, indent=1), flush=True)
    watch.stop()
    (out / f"update_profile{suffix}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
