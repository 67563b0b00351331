"""What a replay on fewer GPUs than its baseline leaves out: the slowest of the baseline's workers.

A baseline's generation on its M GPUs lasts as long as its slowest worker's, and its per-GPU
throughput is all tokens / (M x that time). ``--rl-workload`` gives each of N local GPUs the rows of
one baseline worker: a row's target length depends only on (the step's rollout seed, the row's key
u * n + j over the global prompt index u; trainer/rollout/target_lengths.py), so local worker w
draws exactly what baseline worker w would, and a replay on N < M GPUs leaves workers N..M-1 out.
Their draws differ, and the replay waits only for the slowest of its own.

Here each baseline GPU's share is drawn again (for a rollout without tensor parallelism, where each
GPU decodes its own share, as the replay does) and given its decode bound (each decode step reads
the weights once and every running row's K/V: ``decode_weight_bytes`` and ``kv_cache_read_bytes``),
and ``flattery`` is the factor by which the replay's per-GPU throughput, at the same pace against
the bound, exceeds the one the same engine shows doing the baseline's whole step:
(mean tokens of workers 0..N-1 / their slowest bound) / (mean tokens of all M / the slowest of all M).
It rests on the decode time following the bound; on 4 H200s the replay-gen's per-GPU throughput was
0.904 of one H200's, where the draws give 0.903 (docs/benchmarks.md, "The replay on 2 and 4 GPUs").
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from pytest_rlbench.records.length_shapes import CONSTANT, NATURAL
from pytest_rlbench.records.record import ModelArch, RunRecord
from pytest_rlbench.records.workload import decode_replicas, decode_weight_bytes, kv_cache_read_bytes
from pytest_rlbench.records.workload_replay import TARGET_LENGTHS, workload_overrides
from trainer.config.schema import TrainerSection
from trainer.rollout.requests import rollout_seed
from trainer.rollout.target_lengths import draw_targets

STEPS = range(10)  # the steps a note's factor is averaged over: a session's first rounds


@dataclass(frozen=True)
class WorkerDraw:
    worker: int
    tokens: int
    rows_at_cap: int
    longest: int
    bound_s: float  # at the bandwidth asked for (1 byte/s by default: only ratios are read)


def group_targets(spec: dict, first_prompt: int, prompts: int, seed: int) -> list[int]:
    """The target lengths, at the step of ``seed``, of the rows of ``prompts`` prompts from global
    prompt ``first_prompt`` on: a worker's share, as the driver splits a step's prompts (even_split)."""
    n = spec["actor_rollout_ref.rollout.n"]
    keys = torch.tensor([u * n + j for u in range(first_prompt, first_prompt + prompts) for j in range(n)])
    targets = draw_targets(
        spec[f"{TARGET_LENGTHS}.distribution"], spec[f"{TARGET_LENGTHS}.mean"], spec.get(f"{TARGET_LENGTHS}.sigma", 0.0),
        keys, seed, spec["data.max_response_length"],
    )
    return targets.tolist()


def decode_bound_s(arch: ModelArch, prompt_length: int, targets: list[int], bandwidth: float = 1.0) -> float:
    """Seconds to decode ``targets`` at ``bandwidth`` bytes/s: the weights once per step (as many steps
    as the longest row) and each row's K/V of its prompt and tokens so far."""
    read = max(targets) * decode_weight_bytes(arch) + kv_cache_read_bytes(arch, [prompt_length] * len(targets), targets)
    return read / bandwidth


def draws(
    spec: dict, arch: ModelArch, prompts_per_worker: int, workers: int, seed: int, bandwidth: float = 1.0
) -> list[WorkerDraw]:
    """The first ``workers`` workers' draws at the step of ``seed``, each ``prompts_per_worker`` prompts."""
    prompt, cap = spec["data.synthetic_prompt_length"], spec["data.max_response_length"]
    out = []
    for w in range(workers):
        t = group_targets(spec, w * prompts_per_worker, prompts_per_worker, seed)
        out.append(WorkerDraw(w, sum(t), sum(x == cap for x in t), max(t), decode_bound_s(arch, prompt, t, bandwidth)))
    return out


def pace(ds: list[WorkerDraw]) -> float:
    """Tokens per GPU over the slowest GPU's bound."""
    return statistics.fmean(d.tokens for d in ds) / max(d.bound_s for d in ds)


def flattery(run_draws: list[WorkerDraw], baseline_draws: list[WorkerDraw]) -> float:
    """How much better the replay's per-GPU throughput reads than the baseline's layout would give at
    the same pace: pace(the replay's GPUs' shares) / pace(all the baseline's GPUs' shares)."""
    return pace(run_draws) / pace(baseline_draws)


@dataclass(frozen=True)
class ReplayLayouts:
    """How a step's prompts split over GPUs, each GPU decoding its own share (as the replay does; a
    baseline that decoded with tensor parallelism is a layout difference, not a draw: not here)."""

    spec: dict
    gpus: int  # the baseline's
    prompts_per_gpu: int

    @classmethod
    def of(cls, baseline: RunRecord) -> ReplayLayouts:
        """The split of a replay of ``baseline`` on its own number of GPUs (its train_batch_size is then
        the baseline's prompts per step)."""
        gpus = baseline.hardware.world_size
        spec = {s.key: s.value for s in workload_overrides(baseline, gpus)}
        return cls(spec, gpus, spec["data.train_batch_size"] // gpus)

    def shares(self, arch: ModelArch, seed: int, bandwidth: float = 1.0) -> list[WorkerDraw]:
        """Every baseline GPU's share at the step of ``seed``; a replay on N GPUs decodes the first N."""
        return draws(self.spec, arch, self.prompts_per_gpu, self.gpus, seed, bandwidth)


def flattery_over_steps(baseline: RunRecord, local_gpus: int, trainer_seed: int, steps: Iterable[int] = STEPS) -> list[float]:
    """``flattery`` of a replay on ``local_gpus`` GPUs at each step's rollout seed."""
    layouts = ReplayLayouts.of(baseline)
    factors = []
    for step in steps:
        shares = layouts.shares(baseline.model, rollout_seed(trainer_seed, step))
        factors.append(flattery(shares[:local_gpus], shares))
    return factors


_FACTORS: dict[tuple[str, int, int], list[float]] = {}  # (baseline, GPUs, seed) -> factors: once per session


def slowest_worker_note(run: RunRecord, baseline: RunRecord) -> list[str]:
    """The line a per-GPU gate adds where the run replays fewer GPUs' shares than the baseline ran;
    none without drawn lengths (a constant shape: every GPU the same work) or on as many GPUs."""
    workload = baseline.workload
    if workload is None or workload.response_length.shape.value == CONSTANT:
        return []
    ran, published = run.hardware.world_size, baseline.hardware.world_size
    if ran >= published:
        return []
    line = (
        f"replayed_workers: the baseline's generation lasted as long as the slowest of its {published} GPUs' "
        f"shares of the step's response lengths, this run's as the slowest of its own {ran} (the first "
        f"{ran} of those shares), so its generation throughput per GPU reads higher than this engine "
        f"would show on the baseline's {published} GPUs"
    )
    if workload.response_length.shape.value == NATURAL or decode_replicas(baseline)[0] < published:
        # natural lengths are not drawn from the row keys, and a tensor-parallel rollout decodes
        # several shares together: neither is modelled here
        return [line + " (by how much is not modelled for this baseline's lengths or rollout layout)"]
    seed = TrainerSection().seed
    key = (baseline.name, ran, seed)
    if key not in _FACTORS:
        _FACTORS[key] = flattery_over_steps(baseline, ran, seed)
    factors = _FACTORS[key]
    return [
        line + f": about x{statistics.fmean(factors):.3f} over steps {STEPS[0]}-{STEPS[-1]} "
        f"({min(factors):.3f}-{max(factors):.3f}; step 0, a one-round session's, x{factors[0]:.3f}), at trainer.seed "
        f"{seed}, each share's decode taken as its memory-bandwidth bound (benchmarks/replay_draws.py)"
    ]
