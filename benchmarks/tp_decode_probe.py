"""Tensor-parallel decode on two GPUs against each GPU decoding alone, at the same rows per GPU.

    python benchmarks/tp_decode_probe.py OUT_DIR [--model r1-distill-qwen-7b] [--rows 32 8 2]
                                         [--context 2048 8192 16384 27648] [--prompts 4 --n 8 --max-new 2048]
                                         [--modes tp1 tp2 tp2-one_shot]

Two processes, one GPU each, one NCCL group. For each rows count R and context C it times the fast
engine's captured decode step (benchmarks/decode_profile.py's ``time_step``: median of 20 single
replays, and 50 back to back) as each GPU runs it alone over R rows ("tp1"), and as the two GPUs run it
together, tensor-parallel, over 2R rows ("tp2": each GPU holds half of every layer, two all-reduces a
layer and the sampled tokens broadcast; trainer/rollout/tensor_parallel.py). Both are R rows per GPU,
the per-GPU work of a replay whose shares are split over two GPUs. Then a whole ``generate`` each way:
``--prompts`` prompts x ``--n`` rows per GPU, every row ``--max-new`` tokens (ignore_eos), its seconds,
and how far each row's tokens agree between the two (bf16: the split adds o's and down's sums in
another order, so a row's greedy text may part once two tokens are near-tied). Random weights of the
preset. Results: OUT_DIR/tp_decode_probe.json (rank 0's, with rank 1's seconds beside).
"tp2-one_shot" is tp2 with the group's sums through symmetric memory (tensor_parallel.OneShotReduce)
instead of NCCL; the probe first checks that the two give the same bits, eagerly and in a graph.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from decode_profile import roofline_bytes, time_step  # noqa: E402

from trainer.config import RolloutConfig  # noqa: E402
from trainer.models.presets import build_model, load_tokenizer  # noqa: E402
from trainer.rollout import FastRolloutEngine, SamplingParams  # noqa: E402
from trainer.rollout.decode_buffers import DecodeBuffers  # noqa: E402
from trainer.rollout.tensor_parallel import DecodeGroup, join_decode_group  # noqa: E402

WIDTH = 128  # prompt slots of the timed steps' buffers


def step_times(engine: FastRolloutEngine, rows: int, contexts: list[int], sampling: SamplingParams) -> list[dict]:
    device = engine.device
    buf = DecodeBuffers(engine.weights, rows, WIDTH, max(contexts), engine.stop_token_ids, engine.pad_token_id)
    buf.reset(torch.ones(rows, WIDTH, device=device), torch.arange(rows, device=device), 0)
    out = []
    for context in contexts:
        buf.attn_bias[:, :context] = 0.0
        buf.write_slot.fill_(context - 1)
        attn_len = min(buf.slots, -(-context // 128) * 128)
        seconds, burst_ms = time_step(engine, buf, attn_len, context, sampling)
        out.append({"rows": rows, "context": context, "step_ms": seconds * 1e3, "burst_step_ms": burst_ms,
                    "bytes_per_gpu": roofline_bytes(engine, rows, context)})
    engine.release()
    del buf
    torch.cuda.empty_cache()
    return out


def generate(engine: FastRolloutEngine, prompts: list[list[int]], first_uid: int, args, sampling) -> tuple[float, object]:
    uids = list(range(first_uid, first_uid + len(prompts)))
    torch.cuda.synchronize()
    start = time.perf_counter()
    batch = engine.generate(prompts, uids, [], args.n, args.max_new, sampling, 7)
    torch.cuda.synchronize()
    return time.perf_counter() - start, batch


def agreement(a, b) -> dict:
    """Per row: how many leading tokens agree; and the log-probs' largest gap over those."""
    same = (a.response_ids == b.response_ids).int()
    prefix = same.cumprod(dim=1).sum(dim=1)  # [B] leading tokens that agree
    gaps = [(a.rollout_log_probs[i, : int(p)] - b.rollout_log_probs[i, : int(p)]).abs().max().item() if p else 0.0
            for i, p in enumerate(prefix.tolist())]
    return {"rows": len(prefix), "tokens": a.response_ids.shape[1], "agreeing_prefix": prefix.tolist(),
            "rows_all_agree": int((prefix == a.response_ids.shape[1]).sum()), "max_log_prob_gap": max(gaps)}


def sums_agree(group: DecodeGroup, one_shot: DecodeGroup, device: torch.device, hidden: int) -> dict:
    """NCCL's sum and the one-shot kernel's of the same bf16 values, eagerly and replayed from a graph:
    do they give the same bits? (Two members: a + b rounded once either way.)"""
    g = torch.Generator(device=device).manual_seed(11 + group.rank)
    out = {}
    for rows in (64, 4):
        x = torch.randn(rows, hidden, device=device, dtype=torch.bfloat16, generator=g)
        by_nccl = group.all_reduce(x.clone())
        eager = one_shot.all_reduce(x)
        static = x.clone()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = one_shot.all_reduce(static)
        static.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        out[f"rows_{rows}"] = {"eager_equal": bool(torch.equal(eager, by_nccl)),
                               "graph_equal": bool(torch.equal(captured, by_nccl)),
                               "max_abs_diff": float((eager.float() - by_nccl.float()).abs().max())}
    return out


def rank_main(rank: int, args, port: int) -> None:
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, device_id=device)
    group = join_decode_group(rank, 2, 2)
    model = build_model(args.model, dtype=torch.bfloat16, device=device, seed=0)
    tok = load_tokenizer(args.model)
    sampling = SamplingParams(temperature=0.6)
    result: dict = {"gpu": torch.cuda.get_device_name(device), "model": args.model, "steps": []}
    groups = {"tp1": (None, 1), "tp2": (group, 2)}
    if "tp2-one_shot" in args.modes:
        one_shot = group.with_one_shot(device, torch.bfloat16)
        groups["tp2-one_shot"] = (one_shot, 2)
        result["sums_agree"] = sums_agree(group, one_shot, device, model.config.hidden_size)
        if rank == 0:
            print(json.dumps(result["sums_agree"]), flush=True)
    for label in args.modes:
        tp, factor = groups[label]
        engine = FastRolloutEngine(model, tok, tensor_parallel=tp)
        for rows in args.rows:
            for row in step_times(engine, rows * factor, args.context, sampling):
                result["steps"].append({"mode": label, "rows_per_gpu": rows, **row})
                if rank == 0:
                    print(json.dumps(result["steps"][-1]), flush=True)
        del engine
        torch.cuda.empty_cache()
    # whole generate calls: the same rows per GPU each way
    prompts = [[(7 * rank + 13 * i + j) % 5000 + 100 for j in range(200 + 17 * i)] for i in range(args.prompts)]
    config = RolloutConfig(name="fast", ignore_eos=True)
    runs = {}
    for label in args.modes:
        tp = groups[label][0]
        for sampling_name, s in (("greedy", SamplingParams(do_sample=False)), ("sampled", sampling)):
            engine = FastRolloutEngine(model, tok, config, tensor_parallel=tp)
            generate(engine, prompts, rank * args.prompts, args, s)  # warm-up: graphs captured, kernels compiled
            seconds, batch = generate(engine, prompts, rank * args.prompts, args, s)
            runs[(label, sampling_name)] = (seconds, batch.to("cpu"))
            del engine
            torch.cuda.empty_cache()
    times = torch.tensor([[runs[k][0] for k in sorted(runs)]], device=device)
    every = [torch.zeros_like(times) for _ in range(2)]
    dist.all_gather(every, times)
    result["generate"] = {
        f"{label}-{name}": {"seconds_by_rank": [every[r][0, i].item() for r in range(2)],
                            "rows_per_gpu": args.prompts * args.n, "tokens_per_row": args.max_new}
        for i, (label, name) in enumerate(sorted(runs))
    }
    for a, b in itertools.pairwise(args.modes):  # each mode against the one before it
        for name in ("greedy", "sampled"):
            result["generate"][f"agreement-{a}-{b}-{name}"] = agreement(runs[(a, name)][1], runs[(b, name)][1])
    result["graphs_note"] = "tp2 steps replay CUDA graphs holding NCCL all-reduces (tp2-one_shot: symmetric memory's)"
    if rank == 0:
        Path(args.out, "tp_decode_probe.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result["generate"], indent=1), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--model", default="r1-distill-qwen-7b")
    ap.add_argument("--rows", type=int, nargs="+", default=[32, 8, 2], help="rows per GPU")
    ap.add_argument("--context", type=int, nargs="+", default=[2048, 8192, 16384, 27648])
    ap.add_argument("--prompts", type=int, default=4, help="prompts per GPU in the generate runs")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=2048)
    ap.add_argument("--modes", nargs="+", default=["tp1", "tp2"], choices=["tp1", "tp2", "tp2-one_shot"])
    args = ap.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if torch.cuda.device_count() < 2:
        raise SystemExit("tp_decode_probe: needs two GPUs")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    mp.start_processes(rank_main, args=(args, port), nprocs=2, start_method="spawn")


if __name__ == "__main__":
    main()
