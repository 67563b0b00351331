"""pytest_rlbench/records/replay_draws.py (and benchmarks/replay_draws.py over it): each baseline worker's draw of target lengths, its decode bound, and
how much a replay on fewer GPUs flatters its per-GPU throughput."""

from __future__ import annotations

import gzip
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_rlbench.records.baselines import load_baseline
from pytest_rlbench.records.replay_draws import (
    ReplayLayouts,
    WorkerDraw,
    decode_bound_s,
    flattery,
    group_targets,
    replay_generation_rows,
    replay_worker_rows,
)
from pytest_rlbench.records.workload import decode_weight_bytes
from trainer.config.schema import TargetLengthsConfig
from trainer.rollout.replay_shares import share_targets, slowest_shares
from trainer.rollout.requests import rollout_seed

ROOT = Path(__file__).resolve().parents[1]

MEASURED = ROOT / "docs/benchmarks/2026-11-27/replay_gpus_h200"


def _generated_tokens(report: Path) -> int:
    """Response tokens a recorded replay-gen generated: its gen throughput x seconds x GPUs."""
    d = json.loads(report.read_text())
    gen = d["phases"]["gen"]
    per_gpu = gen["figures"]["tokens_per_s_per_gpu"]["value"]
    return round(per_gpu * gen["seconds"]["samples"][0] * d["run"]["hardware"]["world_size"])


def test_the_draws_are_the_tokens_the_gpu_replays_generated() -> None:
    """Worker w's draw is what local worker w of a replay on GPUs generated (two H200s and one)."""
    layouts = ReplayLayouts.of(load_baseline("verl-v0.5.0-1.5b"))
    seed = rollout_seed(1, 0)  # the trainer's seed; one round, no warm-up: step 0
    per_gpu = layouts.prompts_per_share
    w0, w1 = (sum(group_targets(layouts.spec, w * per_gpu, per_gpu, seed)) for w in (0, 1))
    assert _generated_tokens(MEASURED / "replay-gen_gpus1_h200.json") == w0
    assert _generated_tokens(MEASURED / "replay-gen_gpus2_h200.json") == w0 + w1


def test_the_decode_bound_reads_the_weights_per_step_and_each_rows_kv() -> None:
    arch = load_baseline("verl-v0.5.0-1.5b").model
    per_position = 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * 2  # K and V, bf16
    # rows of 2 and 4 tokens after a 3-token prompt read 3+4 and 3+4+5+6 cached positions
    expected = 4 * decode_weight_bytes(arch) + (7 + 18) * per_position
    assert decode_bound_s(arch, 3, [2, 4], 2.0) == pytest.approx(expected / 2.0)


def test_flattery_is_one_with_every_worker_or_equal_draws_and_above_one_without_the_slowest() -> None:
    equal = [WorkerDraw(w, 100, 0, 50, 10.0) for w in range(4)]
    assert flattery(equal[:1], equal) == pytest.approx(1.0)
    mixed = [WorkerDraw(0, 100, 0, 50, 10.0), WorkerDraw(1, 120, 1, 60, 12.5)]
    assert flattery(mixed, mixed) == pytest.approx(1.0)
    # alone, worker 0 does 100 tokens in 10 s; both together 110 a GPU in the slower's 12.5 s
    assert flattery(mixed[:1], mixed) == pytest.approx((100 / 10.0) / (110 / 12.5))


def test_the_baselines_step_is_drawn_as_one_share_per_decode_replica() -> None:
    """VERL's 7B run: 32 decode replicas of 2 GPUs (rollout tp 2), 64 rows a share; share 1 holds the
    rows of the second replica's prompts."""
    layouts = ReplayLayouts.of(load_baseline("verl-7b"))
    n = layouts.spec["actor_rollout_ref.rollout.n"]
    assert (layouts.replicas, layouts.prompts_per_share * n, layouts.gpus_per_share) == (32, 64, 2)  # rollout tp 2
    verl7b = load_baseline("verl-7b")
    base = layouts.shares(verl7b.model, rollout_seed(1, 0))
    assert len(base) == 32 and flattery(base[:2], base) > 0
    assert base[1].tokens == sum(group_targets(layouts.spec, layouts.prompts_per_share, layouts.prompts_per_share, rollout_seed(1, 0)))


def test_the_measured_four_gpu_throughput_is_what_the_draws_predict() -> None:
    """One H200 and four H200s (two hosts) replaying gen: the four-GPU run's per-GPU throughput over
    the one-GPU run's, against flattery(4 GPUs) / flattery(1 GPU) of step 0's draws (within 3%)."""
    verl = load_baseline("verl-v0.5.0-1.5b")
    one, four = (json.loads((MEASURED / f"replay-gen_gpus{n}_h200.json").read_text()) for n in (1, 4))
    measured = four["phases"]["gen"]["figures"]["tokens_per_s_per_gpu"]["value"] / (
        one["phases"]["gen"]["figures"]["tokens_per_s_per_gpu"]["value"]
    )
    shares = ReplayLayouts.of(verl).shares(verl.model, rollout_seed(1, 0))  # those runs drew shares 0 .. N-1
    f1, f4 = (flattery(shares[:n], shares) for n in (1, 4))
    assert measured == pytest.approx(f4 / f1, rel=0.03), (measured, f4 / f1)


def test_each_replay_workers_rows_are_its_half_of_one_of_the_slowest_shares() -> None:
    """verl-7b on 4 GPUs: the 2 slowest of VERL's 32 decode replicas' shares, each split over 2 workers;
    together the 1,488,269 response tokens the 4-H200 replay's report recorded at step 0."""
    baseline = load_baseline("verl-7b")
    seed = rollout_seed(1, 0)
    workers = replay_generation_rows(baseline, 4, seed)
    assert [len(rows) for rows in workers] == [32] * 4
    report = ROOT / "docs/benchmarks/2026-11-28/replay7b_4gpu_tp2_percall_h200/replay7b-step-tp2.json.gz"
    recorded = json.loads(gzip.open(report, "rt").read())["phases"]["gen"]["figures"]["tokens_per_s_per_gpu"]["basis"]
    assert recorded.startswith(f"{sum(map(sum, workers))} response tokens"), recorded
    # independently: the trainer's choice of shares, each share's rows in halves
    spec = TargetLengthsConfig("lognormal", 10425.773048, 0.5, slowest_of=32, gpus_per_share=2)
    shares = slowest_shares(baseline.model, spec, 16, 4, 2, 150, seed, 27648)
    halves = [t[h * 32 : (h + 1) * 32] for s in shares for t in [share_targets(spec, 16, s * 4, 4, seed, 27648)] for h in (0, 1)]
    assert workers == halves, (shares, [sum(r) for r in workers], [sum(r) for r in halves])


def test_each_replay_worker_trains_on_its_balanced_part_of_every_mini_batch() -> None:
    """verl-7b on 4 GPUs, step 0: a mini-batch is 2 prompts x 16 rows, one generating worker's rows; the
    driver deals each out 8 rows a worker by length (trainer.balance_batch), so the workers' tokens,
    5.4% apart at the most as generated, come within 0.5% of each other, each mini-batch's rows kept."""
    baseline = load_baseline("verl-7b")
    seed = rollout_seed(1, 0)
    generated, trained = replay_generation_rows(baseline, 4, seed), replay_worker_rows(baseline, 4, seed)
    for k in range(4):
        assert sorted(length for rows in trained for length in rows[8 * k : 8 * (k + 1)]) == sorted(generated[k])
    spread = [max(map(sum, w)) / statistics.fmean(map(sum, w)) - 1 for w in (generated, trained)]
    assert spread[0] > 0.05 and spread[1] < 0.005, (spread, [sum(r) for r in trained])


@pytest.mark.parametrize(("generated", "tokens"), [(True, 392_089), (False, 372_017)])
def test_the_script_prints_one_workers_lengths_for_update_profile(generated: bool, tokens: int) -> None:
    """benchmarks/replay_draws.py --worker-rows 4 --lengths-of 2 [--generated]: worker 2's 32 response
    lengths, as it trains on them or (--generated) as it generated them (the stop-49 profile's rows)."""
    command = [sys.executable, "benchmarks/replay_draws.py", "--workload", "verl-7b", "--worker-rows", "4", "--lengths-of", "2"]
    out = subprocess.run(command + ["--generated"] * generated, cwd=ROOT, capture_output=True, text=True, check=True)
    lengths = [int(x) for x in out.stdout.split()]
    assert len(lengths) == 32 and sum(lengths) == tokens, (len(lengths), sum(lengths))
