"""Can the ended rows' old_log_prob run while the tail decodes? One GPU, both at once (issue 31).

    python benchmarks/overlap_probe.py OUT_DIR [--rows 16 8 4] [--context 27648] [--finished 16]
                                               [--finished-len 14000] [--rounds 2] [--config KEY=VALUE ...]
    python benchmarks/overlap_probe.py --read OUT_DIR/overlap_probe.json

The 1.5B replay's generation spends its last ~30 s with 16 rows or fewer alive, reading K/V at a
bandwidth-bound pace while the GPU's compute idles; old_log_prob and ref (about 25 s of the step) are
compute-bound forwards. This measures what running them together would give before anyone builds it.

One training worker as a session builds it (trainer/workers/train_worker.py, FSDP2 over a group of
one, no Ray) at the 1.5B replay's settings (``--rl-workload verl-v0.5.0-1.5b`` on one GPU, with
use_remove_padding and use_liger as the gated step runs). For each rows count R it times, on the
worker's own fast engine, the captured decode step of R rows over ``--context`` cached slots, and
old_log_prob on ``--finished`` ended rows of ``--finished-len`` response tokens each (random ids,
the replay's 148-token prompts): each alone, then both at once, the forward on a second CUDA stream
from a second host thread, as an overlapped phase would run, the decode's host waiting on the stretch
of 32 steps before the last (the engine's loop reads the host after each), its stream of the default
priority or the device's highest (``--decode-priority``); the forward's stream is one, its allocator
pool warmed before any timing. The decode replays enough steps to
outlast the forward alone by a fifth. Reported per R: the decode's
ms/step alone and over the whole pair; the forward's seconds alone, beside the decode, and its span on
the GPU (from its stream's events); ``hidden_s``, the seconds the overlap saves against running the
two one after the other (alone_decode + alone_forward - both); and ``pair_paces``: what each did while
the forward ran, in units of its own pace alone (summed, 1 is the GPU shared with no gain).
``--read OUT/overlap_probe.json`` prints those paces again from a saved file.

GPU only. Results: OUT_DIR/overlap_probe.json (and one JSON line per measurement on stdout).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import torch

REPLAY_1P5B = [  # what --rl-workload verl-v0.5.0-1.5b sets on one GPU (pytest_rlbench/records/workload_replay.py)
    "actor_rollout_ref.model.path=r1-distill-qwen-1.5b",
    "trainer.device=cuda",
    "actor_rollout_ref.rollout.name=fast",
    "actor_rollout_ref.rollout.temperature=0.6",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=30000",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=30000",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.model.use_liger=True",
    "data.max_prompt_length=1024",
    "data.max_response_length=27648",
]
PROMPT_LEN = 148  # the replay's synthetic prompt length


def finished_batch(vocab: int, rows: int, response_len: int, seed: int = 0):
    """``rows`` ended responses of ``response_len`` tokens after ``PROMPT_LEN``-token prompts (random ids)."""
    from trainer.batch import Batch

    gen = torch.Generator().manual_seed(seed)
    return Batch(
        prompt_ids=torch.randint(0, vocab, (rows, PROMPT_LEN), generator=gen),
        prompt_mask=torch.ones(rows, PROMPT_LEN, dtype=torch.long),
        response_ids=torch.randint(0, vocab, (rows, response_len), generator=gen),
        response_mask=torch.ones(rows, response_len, dtype=torch.long),
        uids=torch.arange(rows),
    )


STRETCH = 32  # decode steps between the engine's host checks (trainer/rollout/decode_loop.py)


def pair_paces(steps: int, pair: dict[str, float]) -> dict[str, float]:
    """What each did while the forward ran, in units of its own pace alone, from one measured pair
    (``decode_alone_ms_per_step``, ``decode_ms_per_step_over_the_pair``, ``forward_alone_s``,
    ``forward_span_s``). Both start together; after the forward ends the decode runs alone at its own
    pace, so the decode work left then is the pair's decode time past the forward's span, and the rest
    ran beside the forward. ``paces_summed``: 1, the GPU shared with no gain (one after the other); 2,
    each at its own pace. ``saved_share``: the seconds saved against one after the other, over the
    forward's own."""
    alone = steps * pair["decode_alone_ms_per_step"] / 1e3  # s
    over = steps * pair["decode_ms_per_step_over_the_pair"] / 1e3  # s
    span = pair["forward_span_s"]
    decode_pace = (alone - max(over - span, 0.0)) / span
    forward_pace = pair["forward_alone_s"] / span
    saved = alone + pair["forward_alone_s"] - max(over, span)
    return {
        "decode_pace": decode_pace, "forward_pace": forward_pace, "paces_summed": decode_pace + forward_pace,
        "saved_share": saved / pair["forward_alone_s"],
    }


def read(path: Path) -> None:
    """One line per measured pair of a saved overlap_probe.json: its paces (``pair_paces``)."""
    data = json.loads(path.read_text())
    for row in data["rows"]:
        for pair in row["rounds"]:
            paces = pair_paces(row["steps"], pair)
            print(json.dumps({"rows": row["rows"], "decode_priority": pair["decode_priority"],
                              **{k: round(v, 3) for k, v in paces.items()}}))


def rewind(buf, context: int, steps: int) -> None:
    """The buffers as before a measurement: every row running, the steps writing the slots before
    ``context`` (a row that sampled a stop id would otherwise stay ended, and be skipped, afterwards)."""
    buf.step.zero_()
    buf.write_slot.fill_(max(0, context - steps))
    buf.finished.zero_()
    buf.first_bad.fill_(-1)


def replay(engine, buf, attn_len: int, sampling, steps: int) -> None:
    """``steps`` captured decode steps on the current stream. After each stretch of 32 the host waits for
    the stretch before it, so one stretch stays queued (the engine's loop reads the host after each
    stretch, leaving none) and the wait lets the other thread run."""
    ends: list[torch.cuda.Event] = []
    for i in range(steps):
        engine._step(buf, attn_len, sampling)
        if (i + 1) % STRETCH == 0:
            ends.append(torch.cuda.Event())
            ends[-1].record()
            if len(ends) > 1:
                ends.pop(0).synchronize()
    torch.cuda.current_stream().synchronize()


def decode_steps(engine, buf, attn_len: int, context: int, sampling, steps: int, stream=None) -> float:
    """Seconds for ``steps`` captured decode steps replayed as generation replays them."""
    rewind(buf, context, steps)
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.cuda.stream(stream or torch.cuda.current_stream()):
        replay(engine, buf, attn_len, sampling, steps)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def forward_alone(call) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    call()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def both(engine, buf, attn_len: int, context: int, sampling, steps: int, call, side, stream=None) -> dict[str, float]:
    """The decode on ``stream`` (default: this thread's) and ``call`` on the stream ``side`` from a second
    thread, started together: each one's seconds to its own last kernel, the wall time of the pair, and
    from the GPU's events the forward's span."""
    done: dict[str, float] = {}
    ready = threading.Barrier(2)
    f_start, f_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def forward() -> None:
        with torch.cuda.stream(side):
            ready.wait()
            start = time.perf_counter()
            f_start.record(side)
            call()
            f_end.record(side)
            side.synchronize()
            done["forward_s"] = time.perf_counter() - start

    rewind(buf, context, steps)
    torch.cuda.synchronize()
    worker = threading.Thread(target=forward)
    worker.start()
    with torch.cuda.stream(stream or torch.cuda.current_stream()):
        ready.wait()
        start = time.perf_counter()
        replay(engine, buf, attn_len, sampling, steps)
    done["decode_s"] = time.perf_counter() - start
    worker.join()
    torch.cuda.synchronize()
    done["wall_s"] = time.perf_counter() - start
    # the forward's span on the GPU (its first and last kernel), from its own stream's events
    done["forward_span_s"] = f_start.elapsed_time(f_end) / 1e3
    return done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the results' folder (with --read: a saved overlap_probe.json)")
    ap.add_argument("--read", action="store_true", help="only print the paces of a saved overlap_probe.json")
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 8, 4])
    ap.add_argument("--context", type=int, default=27648)
    ap.add_argument("--finished", type=int, default=16, help="ended rows old_log_prob runs on")
    ap.add_argument("--finished-len", type=int, default=14000, help="each ended row's response tokens")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval seconds (the GIL's; Python's default is 0.005)")
    ap.add_argument("--decode-priority", choices=["normal", "high", "both"], default="both",
                    help="the decode's stream: the default stream's priority, a high-priority stream (its "
                         "blocks are scheduled before the forward's), or each in turn")
    ap.add_argument("--config", nargs="*", default=[], help="KEY=VALUE overrides after the replay's")
    args = ap.parse_args()
    if args.read:
        read(Path(args.out))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.switch_interval is not None:
        import sys

        sys.setswitchinterval(args.switch_interval)

    from trainer.config import build_config
    from trainer.rollout import SamplingParams
    from trainer.rollout.decode_buffers import DecodeBuffers
    from trainer.workers.train_worker import TrainWorker

    cfg = build_config(REPLAY_1P5B + list(args.config))
    worker = TrainWorker(cfg, rank=0, world_size=1)
    host, port = worker.address()
    info = worker.setup(host, port)
    engine = worker.engine
    batch = finished_batch(len(worker.tokenizer), args.finished, args.finished_len)
    call = lambda: worker.compute_old_log_prob(batch)  # noqa: E731
    sampling = SamplingParams(temperature=cfg.actor_rollout_ref.rollout.temperature)
    result: dict[str, Any] = {
        "gpu": info["device_name"], "config": REPLAY_1P5B + list(args.config), "context": args.context,
        "finished_rows": args.finished, "finished_len": args.finished_len,
        "switch_interval_s": args.switch_interval, "rows": [],
    }
    side = torch.cuda.Stream()  # one stream for the forward beside the decode, its allocator pool warmed
    call()  # warm-up: allocator, Triton and liger caches
    with torch.cuda.stream(side):
        call()
    torch.cuda.synchronize()
    fwd = [forward_alone(call) for _ in range(args.rounds)]
    result["forward_alone_s"] = fwd
    print(json.dumps({"forward_alone_s": fwd}), flush=True)
    context = args.context
    for rows in sorted(args.rows, reverse=True):
        buf = DecodeBuffers(engine.weights, rows, 128, context, engine.stop_token_ids, engine.pad_token_id)
        buf.reset(torch.ones(rows, 128, device=engine.device), torch.arange(rows, device=engine.device), 0)
        buf.attn_bias[:, :context] = 0.0
        attn_len = min(buf.slots, -(-context // 128) * 128)
        decode_steps(engine, buf, attn_len, context, sampling, 8)  # eager once, then captured
        probe = decode_steps(engine, buf, attn_len, context, sampling, 50) / 50
        steps = min(context - 1, int(1.2 * statistics.median(fwd) / probe) + 1)
        row: dict[str, Any] = {"rows": rows, "steps": steps, "rounds": []}
        priorities = ["normal", "high"] if args.decode_priority == "both" else [args.decode_priority]
        for _, priority in ((r, p) for r in range(args.rounds) for p in priorities):
            # the highest priority this device offers (lower numbers run first)
            stream = torch.cuda.Stream(priority=min(torch.cuda.Stream.priority_range())) if priority == "high" else None
            decode_steps(engine, buf, attn_len, context, sampling, 8, stream)  # the graph, replayed on this stream
            alone = decode_steps(engine, buf, attn_len, context, sampling, steps, stream)
            f_alone = forward_alone(call)
            pair = both(engine, buf, attn_len, context, sampling, steps, call, side, stream)
            measured = {
                "decode_priority": priority,
                "decode_alone_ms_per_step": alone / steps * 1e3,
                "decode_ms_per_step_over_the_pair": pair["decode_s"] / steps * 1e3,
                "forward_alone_s": f_alone, "forward_beside_s": pair["forward_s"],
                "forward_span_s": pair["forward_span_s"], "wall_s": pair["wall_s"],
                "hidden_s": alone + f_alone - pair["wall_s"],
            }
            row["rounds"].append({**measured, **pair_paces(steps, measured)})
            print(json.dumps({"rows": rows, **row["rounds"][-1]}), flush=True)
        result["rows"].append(row)
        del buf
        torch.cuda.empty_cache()
    (out / "overlap_probe.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
