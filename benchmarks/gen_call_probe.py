"""Where a whole generate call's time goes beyond its decode steps (issue 31): one decode group's rows of
a replay, generated on one GPU call after call, with the CUDA-graph captures and the stretches timed.

    python benchmarks/gen_call_probe.py OUT_DIR [--workload verl-7b] [--gpus 4] [--group 1] [--tp 2]
                                                [--calls 2] [--scale 1.0] [--warm-up]

The rows are those the replay's decode group ``--group`` generates at the first step on ``--gpus`` GPUs
(pytest_rlbench.records.replay_draws.replay_generation_rows: the group's members' rows together),
with their target lengths (times ``--scale``, for a shorter probe). With ``--tp T`` the model is one
member's part of a decode group of T (decode_profile.py's member_model: a member's heads and MLP
width, the LM head whole), so a call does a member's reads and math without the group's sums. Each
call is ``FastRolloutEngine._generate_rows`` as a generate call makes it (its cache and graphs dropped
at the end, as VERL's free_cache_engine=True does), timed whole, with the engine's capture seconds
and graph count, and the decode trace's stretches (trainer/rollout/decode_trace.py). The first call in
a fresh process also compiles the Triton kernels, unless ``--warm-up`` had the engine's warm_up
(a short call of the same shape: FastRolloutEngine.warm_up) compile them first. Results: OUT_DIR/gen_call_probe.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from trainer.config.schema import TrainerSection
from trainer.models.presets import build_model, load_tokenizer
from trainer.rollout import FastRolloutEngine, SamplingParams
from trainer.rollout.requests import RowsRequest, rollout_seed


def group_rows(workload: str, gpus: int, group: int, tp: int) -> list[int]:
    """The target lengths of decode group ``group``'s rows at the replay's first step."""
    from pytest_rlbench.records.baselines import load_baseline
    from pytest_rlbench.records.replay_draws import replay_generation_rows

    per_worker = replay_generation_rows(load_baseline(workload), gpus, rollout_seed(TrainerSection().seed, 0))
    return [length for rows in per_worker[group * tp : (group + 1) * tp] for length in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--workload", default="verl-7b")
    ap.add_argument("--model", default="r1-distill-qwen-7b")
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--group", type=int, default=1)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--n", type=int, default=16, help="rows per prompt")
    ap.add_argument("--prompt", type=int, default=150, help="prompt tokens")
    ap.add_argument("--calls", type=int, default=2)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--warm-up", action="store_true",
                    help="call the engine's warm_up (as a worker does at set-up) before the timed calls")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the probe itself (eager, no graphs)")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gen_call_probe.py needs a CUDA GPU (or --device cpu for a smoke run)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    trace_dir = out / "trace"
    os.environ["RLBENCH_DECODE_TRACE"] = str(trace_dir)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    lengths = [max(1, round(x * args.scale)) for x in group_rows(args.workload, args.gpus, args.group, args.tp)]
    if len(lengths) % args.n:
        raise SystemExit(f"{len(lengths)} rows do not make prompts of --n {args.n}")
    if args.tp == 1:
        model = build_model(args.model, seed=0).to(device, torch.bfloat16)
    else:
        from decode_profile import member_model  # benchmarks/ is on the path: this script runs from there

        model = member_model(args.model, args.tp, device)
    engine = FastRolloutEngine(model, load_tokenizer(args.model))
    sampling = SamplingParams(temperature=0.6)
    rows = len(lengths)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, min(200, model.config.vocab_size), (rows // args.n, args.prompt), generator=gen).repeat_interleave(args.n, dim=0)
    cap = max(lengths)
    calls = []
    warm_up_s = None
    if args.warm_up:
        warm_up_s = engine.warm_up(rows // args.n, args.n, args.prompt, cap, sampling)
        print(json.dumps({"warm_up_s": warm_up_s, **engine.stats}), flush=True)
    for call in range(args.calls):
        engine.stats.clear()
        request = RowsRequest(
            prompt_ids=prompts.to(device), prompt_mask=torch.ones_like(prompts, device=device),
            row_keys=torch.arange(rows, device=device), max_new_tokens=cap, sampling=sampling, seed=call,
            generator=None, micro_batch=0, row_offset=0, n=args.n,
            targets=torch.as_tensor(lengths, device=device), longest_target=cap,
        )
        sync()
        start = time.perf_counter()
        with engine._generation_mode():
            engine._generate_rows(request)
        engine.release()  # what free_cache_engine=True does after each call: the next one captures anew
        sync()
        seconds = time.perf_counter() - start
        calls.append({"call": call, "seconds": seconds, **engine.stats})
        print(json.dumps(calls[-1]), flush=True)
    result = {"gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "model": args.model, "tp": args.tp, "workload": args.workload,
              "group": args.group, "scale": args.scale, "rows": rows, "tokens": sum(lengths), "longest": cap,
              "warm_up_s": warm_up_s, "calls": calls}
    (out / "gen_call_probe.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
