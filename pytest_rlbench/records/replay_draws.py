"""A replay on fewer GPUs than its baseline: which of the baseline's GPUs' shares it does, and how the
per-GPU gate reads it.

A baseline's generation on its M GPUs lasts as long as its slowest GPU's share, and its per-GPU
throughput is all tokens / (M x that time). A row's target length depends only on (the step's rollout
seed, the row's key u * n + j over the prompt uid u; trainer/rollout/target_lengths.py), so the
baseline's whole step can be drawn again: share s holds the prompts of uids s P .. s P + P - 1.

``--rl-workload`` on N < M GPUs sets target_lengths.slowest_of = M: its GPUs generate the N shares with
the largest decode bound (trainer/rollout/replay_shares.py), so the replay waits for what the baseline
waited for. Where the baseline's rollout was tensor-parallel (M replicas of t GPUs, a share each), it
also sets gpus_per_share = t, and the N GPUs generate the N / t slowest replicas' shares, t GPUs each. The gate then reads the baseline's gen and step figures over the run's own rows
(``over_run_rows``: the same rows at the baseline's seconds), and its training phases per token, as
VERL balances those over its ranks; ``slowest_worker_note`` says so among the assumptions.

``flattery`` is what a replay of shares 0 .. N-1 (slowest_of = 0; no gate since) would read too high
by, at the same pace against the bound: (mean tokens of shares 0..N-1 / their slowest bound) / (mean
tokens of all M / the slowest of all M); ``benchmarks/replay_draws.py`` prints it. It rests on the
decode time following the bound; on 4 H200s the replay-gen's per-GPU throughput was 0.904 of one
H200's, where the draws give 0.903 (docs/benchmarks.md, "The replay on 2 and 4 GPUs").
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, replace

from pytest_rlbench.records.length_shapes import CONSTANT
from pytest_rlbench.records.record import DTYPE_BYTES, ModelArch, RunRecord, TokenCounts
from pytest_rlbench.records.workload import workload_tokens
from pytest_rlbench.records.workload_replay import (
    SLOWEST_OF,
    TARGET_LENGTHS,
    decode_replicas,
    expected_shares,
    rollout_tp,
    run_shares,
    workload_overrides,
)
from trainer.config.schema import TargetLengthsConfig, TrainerSection
from trainer.driver.sharding import balanced_mini_batch_shards, even_split
from trainer.models.flops import decode_values_read
from trainer.rollout.replay_shares import heaviest, share_targets, step_uids
from trainer.rollout.requests import rollout_seed

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
    targets = TargetLengthsConfig(
        spec[f"{TARGET_LENGTHS}.distribution"], spec[f"{TARGET_LENGTHS}.mean"], spec.get(f"{TARGET_LENGTHS}.sigma", 0.0)
    )
    n = spec["actor_rollout_ref.rollout.n"]
    return share_targets(targets, n, first_prompt, prompts, seed, spec["data.max_response_length"])


def decode_bound_s(arch: ModelArch, prompt_length: int, targets: list[int], bandwidth: float = 1.0) -> float:
    """Seconds to decode ``targets`` at ``bandwidth`` bytes/s: the weights once per step (as many steps
    as the longest row) and each row's K/V of its prompt and tokens so far."""
    read = decode_values_read(arch, [prompt_length] * len(targets), targets) * DTYPE_BYTES[arch.dtype]
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
    """How a baseline's step split over its decode replicas, each decoding its own share: one GPU each,
    or a tensor-parallel group of ``gpus_per_share`` GPUs (a replay splits such a share over as many)."""

    spec: dict
    replicas: int  # the baseline's shares: its GPUs over its rollout's tensor-parallel size
    prompts_per_share: int
    gpus_per_share: int

    @classmethod
    def of(cls, baseline: RunRecord) -> ReplayLayouts:
        """The split of a replay of ``baseline`` on its own number of GPUs (its train_batch_size is then
        the baseline's prompts per step)."""
        gpus, replicas = baseline.hardware.world_size, decode_replicas(baseline)[0]
        spec = {s.key: s.value for s in workload_overrides(baseline, gpus)}
        return cls(spec, replicas, spec["data.train_batch_size"] // replicas, rollout_tp(baseline))

    def shares(self, arch: ModelArch, seed: int, bandwidth: float = 1.0) -> list[WorkerDraw]:
        """Every baseline replica's share at the step of ``seed`` (a replay generates the slowest), its
        bound as one GPU's reads of the whole share (a group of t GPUs reads 1/t of it each)."""
        return draws(self.spec, arch, self.prompts_per_share, self.replicas, seed, bandwidth)


def replay_worker_rows(baseline: RunRecord, gpus: int, seed: int) -> list[list[int]]:
    """Each worker's training rows' target lengths at the step of ``seed`` in a replay of ``baseline`` on
    ``gpus`` GPUs (--rl-workload): the rows it generated (``replay_generation_rows``) dealt out as the
    driver deals them to old_log_prob, ref and update_actor (trainer.balance_batch, on by default:
    trainer.driver.sharding.balanced_mini_batch_shards), its part of each mini-batch in mini-batch
    order. What a profile of one worker's training phases needs (benchmarks/replay_draws.py --worker-rows)."""
    spec = {s.key: s.value for s in workload_overrides(baseline, gpus)}
    generated = [length for rows in replay_generation_rows(baseline, gpus, seed) for length in rows]
    prompt = spec.get("data.synthetic_prompt_length", 0)  # a constant: it moves no row between workers
    mini_rows = spec["actor_rollout_ref.actor.ppo_mini_batch_size"] * spec["actor_rollout_ref.rollout.n"]
    shards = balanced_mini_batch_shards([prompt + length for length in generated], mini_rows, gpus)
    return [[generated[i] for i in rows] for rows in shards]


def replay_generation_rows(baseline: RunRecord, gpus: int, seed: int) -> list[list[int]]:
    """Each worker's generated rows' target lengths at the step of ``seed`` in a replay of ``baseline``
    on ``gpus`` GPUs: the prompts trainer.rollout.replay_shares.step_uids gives the step, split over the
    workers as the driver splits a step's prompts (trainer.driver.sharding.even_split), n rows each."""
    spec = {s.key: s.value for s in workload_overrides(baseline, gpus)}
    if spec.get(f"{TARGET_LENGTHS}.distribution", "none") == "none":
        raise ValueError(f"{baseline.name}: its responses have no drawn target lengths")
    shares, per = expected_shares(baseline, gpus)
    targets = TargetLengthsConfig(
        spec[f"{TARGET_LENGTHS}.distribution"], spec[f"{TARGET_LENGTHS}.mean"], spec.get(f"{TARGET_LENGTHS}.sigma", 0.0),
        slowest_of=shares, gpus_per_share=per,
    )
    n, prompts, cap = spec["actor_rollout_ref.rollout.n"], spec["data.train_batch_size"], spec["data.max_response_length"]
    uids = step_uids(baseline.model, targets, n, prompts, gpus, spec["data.synthetic_prompt_length"], seed, cap)
    return [
        [length for i in rows for length in share_targets(targets, n, uids[i], 1, seed, cap)]
        for rows in even_split(len(uids), gpus)
    ]


def slowest_tokens_over_steps(baseline: RunRecord, local_gpus: int, trainer_seed: int, steps: Iterable[int] = STEPS) -> list[float]:
    """Per step, the tokens of the slowest shares a replay on ``local_gpus`` GPUs generates
    (target_lengths.slowest_of) over as many average shares of the baseline's step."""
    layouts = ReplayLayouts.of(baseline)
    ratios = []
    for step in steps:
        shares = layouts.shares(baseline.model, rollout_seed(trainer_seed, step))
        slowest = [shares[i] for i in heaviest([d.bound_s for d in shares], local_gpus // layouts.gpus_per_share)]
        ratios.append(statistics.fmean(d.tokens for d in slowest) / statistics.fmean(d.tokens for d in shares))
    return ratios


# The phases whose time a baseline's slowest GPU set: generation, and the step that waits for it. Its
# training phases ran on balanced shares (VERL's trainer.balance_batch, on by default, reorders a step's
# rows so its data-parallel ranks hold about equal tokens) and are compared per token.
SET_BY_SLOWEST = ("gen", "generate_sequences", "step")


def replayed_slowest(run: RunRecord, baseline: RunRecord) -> bool:
    """Whether ``run``, on fewer GPUs than ``baseline``, generated the slowest of the shares the
    baseline waited for (target_lengths.slowest_of and gpus_per_share as a replay of it sets them:
    records.workload_replay.expected_shares)."""
    ran = run.hardware.world_size
    shares = run_shares(run)
    return ran < baseline.hardware.world_size and shares[0] != 0 and shares == expected_shares(baseline, ran)


def share_decode_steps(tok: TokenCounts, shares: int) -> TokenCounts:
    """``tok`` with its decode steps counted per share, for rows that ``shares`` replicas decoded, each
    a consecutive block of them, as long as its longest row (not per GPU, where a replay split a share
    over several GPUs); unchanged without per-row lengths."""
    lengths = tok.response_lengths
    if not lengths or len(lengths) % shares:
        return tok
    rows = len(lengths) // shares
    return replace(tok, decode_steps=sum(max(lengths[i : i + rows]) for i in range(0, len(lengths), rows)))


def over_run_rows(run: RunRecord, baseline: RunRecord) -> tuple[RunRecord, tuple[str, ...]]:
    """``baseline`` with its SET_BY_SLOWEST phases that ``run`` timed over ``run``'s own rows, on
    ``run``'s GPUs, and the names of those phases: for a run that generated the baseline's slowest
    shares, whose seconds the baseline's are, its per-GPU figures for that work. Each of the run's
    rounds pairs with the baseline's round of the same index where both have as many (a saved replay
    drew the same rows at each step), else with the baseline's median. Read only the phases named
    from it: the others are the baseline's, on the wrong number of GPUs."""
    phases, replaced = dict(baseline.phases), []
    shares = run.hardware.world_size // run_shares(run)[1]  # the shares the run generated, one replica each
    for name in SET_BY_SLOWEST:
        theirs = phases.get(name)
        ours = run.phases.get(name) or (run.phases.get("gen") if name == "generate_sequences" else None)
        if theirs is None or ours is None:
            continue
        rounds = [share_decode_steps(t, shares) for t in ours.round_tokens] if ours.round_tokens else None
        count = len(rounds) if rounds else 1
        paired = len(theirs.seconds) == count
        seconds = list(theirs.seconds) if paired else [statistics.median(theirs.seconds)] * count
        tokens = share_decode_steps(ours.tokens or workload_tokens(run), shares)
        phases[name] = replace(theirs, seconds=seconds, tokens=tokens, round_tokens=rounds)
        replaced.append(name)
    hardware = replace(baseline.hardware, world_size=run.hardware.world_size)
    return replace(baseline, phases=phases, hardware=hardware), tuple(replaced)


_RATIOS: dict[tuple[str, int, int], list[float]] = {}  # (baseline, GPUs, seed) -> token ratios: once per session


def slowest_worker_note(run: RunRecord, baseline: RunRecord) -> list[str]:
    """The line a per-GPU gate adds where the run replays fewer GPUs' shares than the baseline ran: which
    shares, and how the gate reads them; none without drawn lengths (a constant shape: every GPU the same
    work) or on as many GPUs. (A replay of its first shares where it could replay the slowest gets no gate
    at all: records.workload.workload_matches.)"""
    workload = baseline.workload
    if workload is None or workload.response_length.shape.value == CONSTANT:
        return []
    ran, published = run.hardware.world_size, baseline.hardware.world_size
    if ran >= published:
        return []
    if not replayed_slowest(run, baseline):
        # reached for a baseline whose rollout decoded several GPUs' shares together (tensor
        # parallelism) or whose lengths are natural: its slowest share is not modelled
        return [
            f"replayed_workers: the baseline's generation lasted as long as the slowest of its decode replicas' "
            f"shares of the step's response lengths, this run's ({ran} GPU(s)) as the slowest of the first shares, "
            f"so its generation throughput per GPU may read higher than this engine would show on the baseline's "
            f"{published} GPUs (by how much is not modelled for this baseline's lengths or rollout layout, or "
            f"this GPU count)"
        ]
    if baseline.config.settings.get(SLOWEST_OF):  # a saved replay: the same choice of shares, made again
        return [
            f"replayed_workers: this run and the baseline (a saved replay) generated the slowest of the same "
            f"{baseline.config.settings[SLOWEST_OF]} shares of each step's drawn lengths; the baseline's gen and "
            f"step figures are read over this run's rows at the baseline's own seconds"
        ]
    seed = TrainerSection().seed
    key = (baseline.name, ran, seed)
    if key not in _RATIOS:
        _RATIOS[key] = slowest_tokens_over_steps(baseline, ran, seed)
    ratios = _RATIOS[key]
    per = run_shares(run)[1]
    layout = decode_replicas(baseline)[1]
    which = (
        f"the {ran} slowest of the baseline's {published} GPUs' shares"
        if per == 1
        else f"the {ran // per} slowest of the baseline's {published // per} decode replicas' shares (of {per} "
        f"GPUs each: its tensor-parallel rollout), each split over {per} of this run's GPUs"
    )
    return [
        f"replayed_workers: this run generated {which} of each step's drawn lengths (target_lengths.slowest_of: "
        f"the most to read at the memory-bandwidth bound), as the baseline's generation waited for its slowest; "
        f"the baseline's gen and step figures are read over this run's rows at the baseline's own seconds. Its "
        f"training phases ran on balanced shares (VERL's trainer.balance_batch) and are compared per token; the "
        f"step is not: this run trained on x{statistics.fmean(ratios):.3f} the mean share's tokens over steps "
        f"{STEPS[0]}-{STEPS[-1]} ({min(ratios):.3f}-{max(ratios):.3f}; the trainer's default seed {seed}), more "
        f"than the baseline's GPUs did, so its step reads slower than like for like"
        + _decode_layout_note(run, per)
        + (f"; the baseline's rollout layout rests on {layout}" if layout else "")
    ]


def _decode_layout_note(run: RunRecord, per: int) -> str:
    """How this run decoded a share that the baseline's ``per`` GPUs decoded together: tensor-parallel as
    they did (the run's rollout_tp), or at another size, whose reads per GPU are named against theirs."""
    if per == 1:
        return ""
    tp = run.config.parallelism.get("rollout_tp", 1)
    if tp == per:
        return f"; each share was decoded by its {per} GPUs together at tensor-parallel size {per}, as the baseline's were"
    reads = "all the" if tp == 1 else f"1/{tp} of the"
    return (
        f"; each of this run's GPUs decodes its part of a share at tensor-parallel size {tp}, reading {reads} "
        f"weights at each decode step where each of the baseline's {per} GPUs read 1/{per} of them: "
        f"{'more' if tp < per else 'fewer'} reads per GPU than the baseline's (a layout, not "
        f"{'more' if tp < per else 'less'} work)"
    )
