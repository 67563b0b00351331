"""Rollout fidelity on a GPU: each engine's speed, its log-probs against the trainer's, and the
sampling-correctness check, on one model after one update and one reshard.

    python benchmarks/gpu_fidelity.py OUT_DIR [--preset r1-distill-qwen-1.5b] [--prompts 16] [--n 8]
        [--prompt-len 256] [--response-len 1024] [--entropy 2.0] [--engines fast,hf,static] [--ragged MEAN]
        [--tp 2]

Random weights are close to uniform over the vocabulary (about 11.9 nats at 151,936 tokens), where
every sampler looks right. So the LM head is scaled by one factor, found by bisection, that puts the
mean entropy of the next-token distribution after the prompts at ``--entropy`` nats: the logits are
those of the same network times a constant, a policy as peaked as a trained one. The actor then takes
one AdamW step (a real update of every weight), each engine receives the new weights through its
reshard path (``sync_from``), and samples ``--prompts`` x ``--n`` responses at temperature 1.
For each engine:
- tokens/s of the generate call (the fast engine's is timed on a second call, after graph capture);
- the fidelity figures of its rollout_log_probs against the trainer's old_log_prob (the bf16 actor's
  forward, as the step computes it): trainer.algorithms.fidelity;
- the sampling check (trainer.algorithms.sampling_check) under an fp32 copy of the updated actor, and
  beside it the engine's distance from that copy (``kl_engine_fp32``): how large a gap bf16 alone
  can make;
- the sampler check (trainer.rollout.sampling_audit.sampler_check): the same statistic under the
  engine's own distributions, from the entropies it reports, which tests the sampler alone at any
  precision; and the precision shift, the part of the fp32 check's gap that the engine's own
  distributions make (the fp32 gap is the sampler's gap plus it, exactly).
The timed call samples as a rollout does; a second call at the same seed asks for the entropies too,
and ``same_tokens`` says whether it drew the timed call's tokens: the fast and static engines do (asking
for the entropies changes no token), transformers' generate on a GPU does not repeat itself at a seed.
With ``--ragged MEAN`` each row's length is drawn (rollout.target_lengths: log-normal, sigma 1, mean
MEAN tokens, capped at --response-len), so rows end at different steps and the fast engine's row
compaction, its attention's skipping of ended rows and its chunks sized for the rows running are
all in the sampled tokens; without it every row is --response-len long.
With ``--tp T`` the fast engine alone runs, tensor-parallel over T GPUs (T processes, one NCCL group;
gloo with --device cpu): each process builds the same model, rank 0's updated weights are broadcast so
the group holds one model, each process asks for its share of the prompts and the group decodes them
together (trainer/rollout/tensor_parallel.py). Rank 0 gathers every process's rows and scores and
judges them as one batch against its whole fp32 and bf16 copies.
Writes OUT_DIR/fidelity.json and prints one line per engine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainer.algorithms.fidelity import rollout_fidelity
from trainer.algorithms.sampling_check import precision_shift, sampling_check
from trainer.batch import Batch, concat_batches
from trainer.config.schema import RolloutConfig, TargetLengthsConfig
from trainer.models.presets import build_model, load_tokenizer
from trainer.rollout import make_engine
from trainer.rollout.requests import SamplingParams
from trainer.rollout.sampling_audit import fp32_reference, reference_figures, sampler_check
from trainer.rollout.tensor_parallel import join_decode_group
from trainer.workers.actor import compute_log_probs
from trainer.workers.distributed import DataParallel
from trainer.workers.fsdp import PolicyModel


def mean_entropy(logits: torch.Tensor) -> float:
    log_p = logits.float().log_softmax(-1)  # [B, V]
    return float(-(log_p.exp() * log_p).sum(-1).mean())


@torch.no_grad()
def head_scale_for_entropy(model: torch.nn.Module, prompts: torch.Tensor, target: float) -> float:
    """The factor on the LM head that gives ``target`` nats of mean entropy after the prompts."""
    logits = model(prompts).logits[:, -1].float()  # [B, V]
    low, high = 1e-2, 1e3
    for _ in range(50):  # entropy falls as the scale grows
        mid = math.sqrt(low * high)
        low, high = (mid, high) if mean_entropy(logits * mid) > target else (low, mid)
    return math.sqrt(low * high)


def one_update(model: torch.nn.Module, prompts: torch.Tensor, lr: float) -> None:
    """One AdamW step on the next-token loss of the prompts: every weight moves by about ``lr``."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    loss = model(prompts, labels=prompts).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()


def trainer_log_probs(actor: torch.nn.Module, batch: Batch, device: str, rows_per_forward: int = 8) -> torch.Tensor:
    """old_log_prob as the step computes it (trainer.workers.actor.compute_log_probs): the bf16
    actor's forward at temperature 1, [B, R] on CPU."""
    return compute_log_probs(
        PolicyModel(actor), batch, 1.0, rows_per_forward, False, 0, DataParallel(), torch.device(device)
    )


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


AUDITED = SamplingParams(report_entropy=True)
TIMED_SEED = 2  # the timed call's, which the audited call repeats (seed 1 is the graph-capturing warm-up's)


def timed_generate(
    engine, prompts, n, response_len, seed, uids: list[int] | None = None, sampling: SamplingParams = SamplingParams()
) -> tuple[Batch, float]:
    synchronize()
    start = time.perf_counter()
    uids = list(range(len(prompts))) if uids is None else uids
    batch = engine.generate(prompts, uids, [], n, response_len, sampling, seed)
    synchronize()
    return batch, time.perf_counter() - start


def token_figures(actor: torch.nn.Module, judge: PolicyModel, batch: Batch, device: str) -> dict[str, torch.Tensor]:
    """What the fidelity figures and the check read of one batch, each [B, R] on the CPU."""
    log_probs, entropies = reference_figures(judge, batch, 1.0)
    return {"old": trainer_log_probs(actor, batch, device), "rollout": batch.rollout_log_probs,
            "rollout_entropies": batch.rollout_entropies, "mask": batch.response_mask,
            "log_probs": log_probs, "entropies": entropies}


def kl_engine_fp32(figures: dict[str, torch.Tensor]) -> float:
    """KL(q || p) estimated as mean(log q(y) - log p(y)) over the sampled tokens: q the engine's bf16
    distribution (its own log-probs), p the fp32 copy's. A sampler that draws exactly from q moves the
    check's gap by H(p) - H(q) - KL(q || p) (E_q[log p] = -H(q) - KL(q || p)): this says how large a
    gap the engine's distance from fp32 alone can make. (It assumes the tokens were drawn from q.)"""
    keep = figures["mask"].bool()
    return float((figures["rollout"].double()[keep] - figures["log_probs"].double()[keep]).mean())


def check_row(check) -> dict:
    return {**check.__dict__, "z": check.z, "passed": check.passed}


def judged(batch: Batch, figures: dict[str, torch.Tensor], seconds: float, synced: int, same_tokens: bool) -> dict:
    """One engine's row of fidelity.json: speed, fidelity against the trainer, the sampling check under
    the fp32 judge, and the sampler check under the engine's own distributions with the shift between.
    ``batch``: the audited call's, which ``figures`` (token_figures) were read from."""
    tokens = int(figures["mask"].sum())
    fidelity = rollout_fidelity(figures["old"], figures["rollout"], figures["mask"])
    check = sampling_check(figures["log_probs"], figures["entropies"], figures["mask"])
    own = sampler_check(batch, AUDITED)
    shift = precision_shift(figures["log_probs"], figures["entropies"], figures["rollout"],
                            figures["rollout_entropies"], figures["mask"])
    kl = kl_engine_fp32(figures)
    return {"reshard_bytes": synced, "generate_s": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
            "fidelity": fidelity, "check": check_row(check), "sampler_check": check_row(own),
            "precision_shift": shift, "kl_engine_fp32": kl, "same_tokens": same_tokens,
            "line": f"{tokens / seconds:,.0f} tok/s; token_mult_prob_error "
                    f"{fidelity['rollout_fidelity/token_mult_prob_error']:.4f}, mismatch_kl "
                    f"{fidelity['rollout_fidelity/mismatch_kl']:.2e}, pearson "
                    f"{fidelity['rollout_fidelity/pearson']:.5f}\n  under fp32: {check.describe()}; "
                    f"KL(engine || fp32) {kl:.4f}\n  under its own q: {own.describe('sampler check')}"
                    f"\n  the fp32 gap {check.gap:+.4f} = sampler gap {own.gap:+.4f} + precision shift {shift:+.4f} nats"
                    f"{'' if same_tokens else '; the audited call drew other tokens than the timed call'}"}


def audited(engine, prompts, n, response_len, timed: Batch, uids: list[int] | None = None) -> tuple[Batch, bool]:
    """The timed call again with the entropies reported (same seed), and whether its tokens are the same."""
    batch, _ = timed_generate(engine, prompts, n, response_len, seed=TIMED_SEED, uids=uids, sampling=AUDITED)
    return batch, torch.equal(batch.response_ids, timed.response_ids)  # False for other shapes too


def build_actor(args, device: str) -> tuple[torch.nn.Module, object, torch.Tensor, float]:
    """The preset's actor with its LM head scaled to --entropy nats, its tokenizer, the prompts [P, L]
    (on the CPU) and the scale. Seeded: every process of a --tp group builds the same."""
    actor = build_model(args.preset, torch.bfloat16 if args.device == "cuda" else torch.float32, device, seed=0).eval()
    tokenizer = load_tokenizer(args.preset)
    generator = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(1, actor.config.vocab_size, (args.prompts, args.prompt_len), generator=generator)
    scale = head_scale_for_entropy(actor, prompt_ids.to(device), args.entropy)
    with torch.no_grad():
        actor.get_output_embeddings().weight.mul_(scale)
    return actor, tokenizer, prompt_ids, scale


def rollout_config(args) -> dict:
    config: dict = dict(ignore_eos=True, n=args.n)
    if args.ragged:
        config["target_lengths"] = TargetLengthsConfig(distribution="lognormal", mean=args.ragged, sigma=1.0)
    return config


def header(args, scale: float) -> dict:
    return {"preset": args.preset, "head_scale": scale, "lr": args.lr,
            "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "tp": args.tp,
            "shape": f"{args.prompts} x {args.n}, prompt {args.prompt_len} + response {args.response_len}",
            "ragged_mean": args.ragged, "engines": {}}


def one_process(args) -> None:
    actor, tokenizer, prompt_ids, scale = build_actor(args, args.device)
    print(f"LM head scaled by {scale:.3f} for {args.entropy} nats after the prompts", flush=True)
    # share_weights=False: each engine holds its own copy, so the reshard below is what brings the update
    engines = {
        name: make_engine(name, actor, tokenizer, RolloutConfig(name=name, **rollout_config(args)), share_weights=False)
        for name in args.engines.split(",")
    }
    one_update(actor, prompt_ids.to(args.device), args.lr)
    judge = fp32_reference(actor)
    results = header(args, scale)
    for name, engine in engines.items():
        synced = engine.sync_from(actor)
        if name == "fast":  # capture the decode graphs first, as a benchmark's warm-up round does
            timed_generate(engine, prompt_ids.tolist(), args.n, args.response_len, seed=1)
        batch, seconds = timed_generate(engine, prompt_ids.tolist(), args.n, args.response_len, seed=TIMED_SEED)
        batch, same = audited(engine, prompt_ids.tolist(), args.n, args.response_len, batch)
        batch = batch.to("cpu")
        row = judged(batch, token_figures(actor, judge, batch, args.device), seconds, synced, same)
        results["engines"][name] = row
        print(f"{name}: {row['line']}", flush=True)
        (args.out / "fidelity.json").write_text(json.dumps(results, indent=1, default=float))


def tp_rank(rank: int, args, port: int) -> None:
    """One process of a --tp group: its share of the prompts, decoded by the whole group."""
    cuda = args.device == "cuda"
    device = f"cuda:{rank}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.tp, device_id=torch.device(device) if cuda else None)
    try:
        group = join_decode_group(rank, args.tp, args.tp)
        actor, tokenizer, prompt_ids, scale = build_actor(args, device)
        engine = make_engine("fast", actor, tokenizer, RolloutConfig(name="fast", **rollout_config(args)),
                             tensor_parallel=group)
        one_update(actor, prompt_ids.to(device), args.lr)
        with torch.no_grad():  # one model for the group, whatever each process's update rounded
            for param in actor.parameters():
                dist.broadcast(param.data, 0)
        judge = fp32_reference(actor) if rank == 0 else None  # rank 0 alone scores the rows
        # Each prompt keeps its index as its uid, as in one process: target lengths and sampling noise are
        # keyed by it, so the group samples the rows one GPU would.
        uids = list(range(rank, args.prompts, args.tp))
        mine = prompt_ids[uids].tolist()
        synced = engine.sync_from(actor)
        timed_generate(engine, mine, args.n, args.response_len, seed=1, uids=uids)  # graphs captured
        batch, seconds = timed_generate(engine, mine, args.n, args.response_len, seed=TIMED_SEED, uids=uids)
        batch, same = audited(engine, mine, args.n, args.response_len, batch, uids=uids)
        parts: list = [None] * args.tp
        dist.all_gather_object(parts, (batch.to("cpu"), seconds, same))
        if rank == 0:  # every process holds the whole model: rank 0 scores the group's rows as one batch
            results = header(args, scale)
            rows = concat_batches([p[0] for p in parts])
            row = judged(rows, token_figures(actor, judge, rows, device), max(p[1] for p in parts), synced,
                         all(p[2] for p in parts))
            results["engines"]["fast"] = {**row, "rows_by_rank": [p[0].size for p in parts]}
            print(f"fast (tensor-parallel over {args.tp}): {row['line']}", flush=True)
            (args.out / "fidelity.json").write_text(json.dumps(results, indent=1, default=float))
        # The engine's CUDA graphs hold the group's NCCL communicator: release them before the group
        # goes, or tearing it down waits on them (seen on two H200s: the script hung after its result).
        engine.release()
        synchronize()
        dist.barrier()
    finally:  # no collective here: a rank that failed must not wait for one that never comes
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--preset", default="r1-distill-qwen-1.5b")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--response-len", type=int, default=1024)
    parser.add_argument("--entropy", type=float, default=2.0)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--engines", default="fast,hf,static")
    parser.add_argument("--ragged", type=float, default=0.0,
                        help="mean tokens of log-normal target lengths (0: every row --response-len long)")
    parser.add_argument("--tp", type=int, default=1,
                        help="tensor-parallel size of the fast engine's decode (processes; the fast engine alone)")
    parser.add_argument("--device", default="cuda", help="cuda; cpu only to try the script on a small preset")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_fidelity.py: no CUDA GPU here (--device cpu runs it on the CPU, for a small preset)")
    if not 0 <= args.ragged <= args.response_len:
        parser.error(f"--ragged {args.ragged}: the mean length must lie in [0, --response-len {args.response_len}]")
    if args.tp < 1 or args.prompts % args.tp:
        parser.error(f"--tp {args.tp}: must be at least 1 and divide --prompts {args.prompts}")
    if args.tp > 1 and args.engines != "fast":
        parser.error(f"--tp {args.tp} runs the fast engine alone (the others decode on one device): pass --engines fast")
    if args.tp > 1 and args.device == "cuda" and torch.cuda.device_count() < args.tp:
        parser.error(f"--tp {args.tp}: needs {args.tp} GPUs, {torch.cuda.device_count()} here")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.tp == 1:
        one_process(args)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    mp.start_processes(tp_rank, args=(args, port), nprocs=args.tp, start_method="spawn")


if __name__ == "__main__":
    main()
