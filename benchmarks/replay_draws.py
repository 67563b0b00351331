"""Each baseline worker's draw of target lengths and its decode bound, the slowest of which set the
baseline's phase time, and what a replay of the first shares would leave out (issue 31). CPU only, seconds.

    python benchmarks/replay_draws.py [--workload verl-v0.5.0-1.5b] [--gpus 1 2 4] [--steps 0 1 2]
                                      [--gpu "H100 SXM"] [--seed 1] [--json OUT.json]
    python benchmarks/replay_draws.py --workload verl-7b --worker-rows 4 [--steps 0] [--lengths-of 2] [--generated]

A baseline's generation on its M GPUs lasts as long as its slowest worker's, and its per-GPU
throughput is all tokens / (M x that time). The rows' target lengths depend only on (the step's rollout
seed, the row's key u * n + j over the prompt uid u; trainer/rollout/target_lengths.py), so every
baseline worker's share can be drawn again here.

For each step this prints every baseline worker's draw and decode bound at the GPU's peak bandwidth,
then, for each N, the factor by which a replay of shares 0 .. N-1 (target_lengths.slowest_of=0) would
read too high at the same pace, against the same engine doing the baseline's whole step. A factor
above 1 flatters the replay. ``--rl-workload`` instead generates the N slowest shares
(trainer/rollout/replay_shares.py), and the per-GPU gate compares seconds for those rows
(pytest_rlbench/records/replay_draws.py).

``--worker-rows N`` instead prints, for each step, what each worker of a replay on N GPUs trains on
(its part of each mini-batch, dealt out by trainer.balance_batch, in mini-batch order; ``--generated``:
what it generated): its rows, tokens, longest row and the sum of squared sequence lengths
(attention's share of the work grows with it); ``--lengths-of W`` prints only worker W's response
lengths at the first step, space-separated, for ``benchmarks/update_profile.py --response-lengths``
(whose ``--mini-batches M`` takes them as M equal runs, as they are laid out).
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict
from pathlib import Path

from pytest_rlbench.records.baselines import load_baseline
from pytest_rlbench.records.replay_draws import (
    ReplayLayouts,
    flattery,
    replay_generation_rows,
    replay_worker_rows,
)
from pytest_rlbench.verdict.peaks import peak_memory_bandwidth
from trainer.config.schema import TrainerSection
from trainer.rollout.requests import rollout_seed


def print_worker_rows(ap: argparse.ArgumentParser, baseline, args: argparse.Namespace) -> None:
    gpus, seed_base = args.worker_rows, TrainerSection().seed if args.seed is None else args.seed
    if not 1 <= gpus <= baseline.hardware.world_size:
        ap.error(f"--worker-rows {gpus}: a replay runs on 1 .. {baseline.hardware.world_size} GPUs (the baseline's count)")
    if args.lengths_of is not None and not 0 <= args.lengths_of < gpus:
        ap.error(f"--lengths-of {args.lengths_of}: the workers are 0 .. {gpus - 1}")
    prompt = baseline.workload.prompt_length.mean.value if baseline.workload else 0
    try:
        rows_of = replay_generation_rows if args.generated else replay_worker_rows
        per_step = [(step, rows_of(baseline, gpus, rollout_seed(seed_base, step))) for step in args.steps]
    except ValueError as exc:  # a WorkloadError too
        ap.error(f"--workload {args.workload}: {exc}")
    if args.lengths_of is not None:
        print(" ".join(str(length) for length in per_step[0][1][args.lengths_of]))
        return
    result = {"workload": args.workload, "gpus": gpus, "trainer_seed": seed_base, "steps": []}
    for step, workers in per_step:
        print(f"step {step}: worker | rows | response tokens | longest | sum of (prompt + response)^2")
        for w, rows in enumerate(workers):
            squares = sum((prompt + length) ** 2 for length in rows)
            print(f"  {w:2d} | {len(rows)} | {sum(rows):,} | {max(rows):,} | {squares:.3e}")
        result["steps"].append({"step": step, "workers": workers})
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="verl-v0.5.0-1.5b")
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--steps", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--gpu", default="H100 SXM",
                    help="the GPU whose peak bandwidth the bounds' seconds use (the factors do not depend on it)")
    ap.add_argument("--seed", type=int, default=None, help="trainer.seed (default: the trainer's)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker-rows", type=int, default=None, metavar="N",
                    help="each worker's rows in a replay on N GPUs, instead of the draws")
    ap.add_argument("--lengths-of", type=int, default=None, metavar="W",
                    help="with --worker-rows: only worker W's response lengths at the first step")
    ap.add_argument("--generated", action="store_true",
                    help="with --worker-rows: the rows each worker generated, not those it trains on")
    args = ap.parse_args()
    baseline = load_baseline(args.workload)
    if args.worker_rows is not None:
        print_worker_rows(ap, baseline, args)
        return
    workers = baseline.hardware.world_size
    layouts = ReplayLayouts.of(baseline)
    per = layouts.gpus_per_share
    if any(n < 1 or n > workers or n % per for n in args.gpus):
        ap.error(f"--gpus: each must be a multiple of {per} (the GPUs of one share) in 1..{workers}, the baseline's GPU count")
    spec = layouts.spec
    if spec.get("actor_rollout_ref.rollout.target_lengths.distribution", "none") == "none":
        ap.error(f"--workload {args.workload}: its responses have no drawn target lengths to compare")
    if per > 1:
        print(f"note: {args.workload}'s rollout decoded with tensor parallelism ({layouts.replicas} replicas of {per} "
              f"GPUs): a share is one replica's, its bound below as one GPU reading all of it (a replica of {per} "
              f"GPUs reads 1/{per} each); a replay on N GPUs holds N/{per} shares")
    gpu = args.gpu
    bandwidth = peak_memory_bandwidth(gpu)
    if bandwidth is None:
        ap.error(f"--gpu {gpu!r}: no peak memory bandwidth tabled for it (pytest_rlbench/verdict/peaks.py)")
    trainer_seed = TrainerSection().seed if args.seed is None else args.seed
    n = spec["actor_rollout_ref.rollout.n"]
    print(f"{args.workload}: {layouts.replicas} shares of {layouts.prompts_per_share * n} rows each; bounds on one "
          f"{gpu} ({bandwidth / 1e12:.2f} TB/s); trainer.seed {trainer_seed}")
    result = {"workload": args.workload, "gpu": gpu, "trainer_seed": trainer_seed, "steps": []}
    factors: dict[int, list[float]] = {g: [] for g in args.gpus}
    for step in args.steps:
        seed = rollout_seed(trainer_seed, step)
        base = layouts.shares(baseline.model, seed, bandwidth)
        slowest = max(base, key=lambda d: d.bound_s)
        print(f"\nstep {step}: share | tokens | rows at the cap | longest | decode bound (s)")
        for d in base:
            mark = "  <- slowest" if d is slowest else ""
            print(f"  {d.worker:2d} | {d.tokens:,} | {d.rows_at_cap} | {d.longest:,} | {d.bound_s:.1f}{mark}")
        row = {"step": step, "shares": [asdict(d) for d in base], "flattery": {}}
        for g in args.gpus:
            run = base[: g // per]
            f = flattery(run, base)
            factors[g].append(f)
            row["flattery"][g] = f
            print(f"  a replay on {g} GPU(s): slowest bound {max(d.bound_s for d in run):.1f} s, the baseline's "
                  f"{slowest.bound_s:.1f} s; its per-GPU throughput flattered x{f:.3f}")
        result["steps"].append(row)
    print("\nflattery over the steps (mean, min-max):")
    for n, fs in factors.items():
        print(f"  {n} GPU(s): x{statistics.fmean(fs):.3f} ({min(fs):.3f}-{max(fs):.3f})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
