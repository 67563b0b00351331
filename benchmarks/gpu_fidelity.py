"""Rollout fidelity on a GPU: each engine's speed, its log-probs against the trainer's, and the
sampling-correctness check, on one model after one update and one reshard.

    python benchmarks/gpu_fidelity.py OUT_DIR [--preset r1-distill-qwen-1.5b] [--prompts 16] [--n 8]
        [--prompt-len 256] [--response-len 1024] [--entropy 2.0] [--engines fast,hf,static] [--ragged MEAN]

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
- the sampling check (trainer.algorithms.sampling_check) under an fp32 copy of the updated actor.
With ``--ragged MEAN`` each row's length is drawn (rollout.target_lengths: log-normal, sigma 1, mean
MEAN tokens, capped at --response-len), so rows end at different steps and the fast engine's row
compaction, its attention's skipping of ended rows and its chunks sized for the rows running are
all in the sampled tokens; without it every row is --response-len long.
Writes OUT_DIR/fidelity.json and prints one line per engine.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from trainer.algorithms.fidelity import rollout_fidelity
from trainer.algorithms.sampling_check import sampling_check
from trainer.batch import Batch
from trainer.config.schema import RolloutConfig, TargetLengthsConfig
from trainer.models.presets import build_model, load_tokenizer
from trainer.rollout import make_engine
from trainer.rollout.requests import SamplingParams
from trainer.rollout.sampling_audit import fp32_reference, reference_figures
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


def timed_generate(engine, prompts, n, response_len, seed) -> tuple[Batch, float]:
    synchronize()
    start = time.perf_counter()
    batch = engine.generate(prompts, list(range(len(prompts))), [], n, response_len, SamplingParams(), seed)
    synchronize()
    return batch, time.perf_counter() - start


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
    parser.add_argument("--device", default="cuda", help="cuda; cpu only to try the script on a small preset")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_fidelity.py: no CUDA GPU here (--device cpu runs it on the CPU, for a small preset)")
    if not 0 <= args.ragged <= args.response_len:
        parser.error(f"--ragged {args.ragged}: the mean length must lie in [0, --response-len {args.response_len}]")
    args.out.mkdir(parents=True, exist_ok=True)

    actor = build_model(args.preset, torch.bfloat16 if args.device == "cuda" else torch.float32, args.device, seed=0).eval()
    tokenizer = load_tokenizer(args.preset)
    generator = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(1, actor.config.vocab_size, (args.prompts, args.prompt_len), generator=generator)
    prompts = prompt_ids.to(args.device)
    scale = head_scale_for_entropy(actor, prompts, args.entropy)
    with torch.no_grad():
        actor.get_output_embeddings().weight.mul_(scale)
    print(f"LM head scaled by {scale:.3f} for {args.entropy} nats after the prompts", flush=True)

    config: dict = dict(ignore_eos=True, n=args.n)
    if args.ragged:
        config["target_lengths"] = TargetLengthsConfig(distribution="lognormal", mean=args.ragged, sigma=1.0)
    # share_weights=False: each engine holds its own copy, so the reshard below is what brings the update
    engines = {
        name: make_engine(name, actor, tokenizer, RolloutConfig(name=name, **config), share_weights=False)
        for name in args.engines.split(",")
    }
    one_update(actor, prompts, args.lr)
    judge = fp32_reference(actor)
    results = {"preset": args.preset, "head_scale": scale, "lr": args.lr, "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
               "shape": f"{args.prompts} x {args.n}, prompt {args.prompt_len} + response {args.response_len}",
               "ragged_mean": args.ragged,
               "engines": {}}
    for name, engine in engines.items():
        synced = engine.sync_from(actor)
        if name == "fast":  # capture the decode graphs first, as a benchmark's warm-up round does
            timed_generate(engine, prompt_ids.tolist(), args.n, args.response_len, seed=1)
        batch, seconds = timed_generate(engine, prompt_ids.tolist(), args.n, args.response_len, seed=2)
        batch = batch.to("cpu")
        tokens = int(batch.response_mask.sum())
        old = trainer_log_probs(actor, batch, args.device)
        fidelity = rollout_fidelity(old, batch.rollout_log_probs, batch.response_mask)
        log_probs, entropies = reference_figures(judge, batch, 1.0)
        check = sampling_check(log_probs, entropies, batch.response_mask)
        row = {"reshard_bytes": synced, "generate_s": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
               "fidelity": fidelity, "check": {**check.__dict__, "z": check.z, "passed": check.passed}}
        results["engines"][name] = row
        print(f"{name}: {tokens / seconds:,.0f} tok/s; token_mult_prob_error "
              f"{fidelity['rollout_fidelity/token_mult_prob_error']:.4f}, mismatch_kl "
              f"{fidelity['rollout_fidelity/mismatch_kl']:.2e}, pearson {fidelity['rollout_fidelity/pearson']:.5f}; "
              f"{check.describe()}", flush=True)
        (args.out / "fidelity.json").write_text(json.dumps(results, indent=1, default=float))


if __name__ == "__main__":
    main()
