"""Replayed lengths through the whole trainer on a real local Ray: rollout.target_lengths reaches
every worker's engine, each row's length does not depend on how many workers split the batch, and
data.synthetic_prompt_length gives every prompt exactly that many tokens."""

from __future__ import annotations

import pytest
import ray
import torch

from trainer.build import build_trainer, ray_session
from trainer.config import build_config
from trainer.rollout.target_lengths import draw_targets

N, CAP, PROMPT = 4, 24, 96
REPLAY = [
    "data.synthetic_difficulty=tiny",
    "data.train_batch_size=8",
    f"data.max_response_length={CAP}",
    "data.max_prompt_length=128",
    f"data.synthetic_prompt_length={PROMPT}",
    f"actor_rollout_ref.rollout.n={N}",
    "actor_rollout_ref.rollout.name=static",
    "actor_rollout_ref.rollout.target_lengths.distribution=lognormal",
    "actor_rollout_ref.rollout.target_lengths.mean=10",
    "actor_rollout_ref.rollout.target_lengths.sigma=0.7",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
]


@pytest.fixture(scope="module")
def local_ray():
    with ray_session(num_cpus=2) as started:
        assert started and ray.is_initialized()
        yield


def rollout_lengths(workers: int, workdir) -> tuple[list[int], list[int], list[int]]:
    """(response lengths, the targets drawn for the step's seed, prompt lengths) of one rollout."""
    trainer = build_trainer(build_config([*REPLAY, f"trainer.n_gpus_per_node={workers}"]), workdir)
    try:
        batch = trainer.generate_sequences(next(trainer.loader))
        keys = torch.arange(8 * N)  # uid u (its position in the step's batch), response j: u * n + j
        targets = draw_targets("lognormal", 10.0, 0.7, keys, trainer._rollout_seed(), CAP).tolist()
        return batch.response_mask.sum(dim=1).tolist(), targets, batch.prompt_mask.sum(dim=1).tolist()
    finally:
        trainer.shutdown()


def test_replayed_lengths_reach_every_worker_and_do_not_depend_on_the_split(local_ray, tmp_path):
    one, targets, prompts = rollout_lengths(1, tmp_path)
    assert one == targets and len(set(one)) > 3
    assert prompts == [PROMPT] * (8 * N)
    two, _, _ = rollout_lengths(2, tmp_path)
    assert two == one


def test_slowest_of_generates_the_slowest_shares_of_the_run_replayed(local_ray, tmp_path):
    """8 prompts on one worker as one of 4 GPUs' shares (a step of 32 prompts): the worker generates the
    share with the most to read, with that share's uids, and the whole step trains on it."""
    from trainer.rollout.replay_shares import share_targets, slowest_shares

    cfg = build_config([*REPLAY, "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.target_lengths.slowest_of=4"])
    trainer = build_trainer(cfg, tmp_path)
    try:
        prompts = next(trainer.loader)
        seed, spec = trainer._rollout_seed(), cfg.actor_rollout_ref.rollout.target_lengths
        chosen = slowest_shares(trainer.spec.arch, spec, N, 8, 1, PROMPT, seed, CAP)
        assert chosen != [0], "the test's seed should pick another share than the first"
        batch = trainer.generate_sequences(prompts)
        lengths = batch.response_mask.sum(dim=1).tolist()
        assert lengths == share_targets(spec, N, chosen[0] * 8, 8, seed, CAP)
        assert sorted(set(batch.uids.tolist())) == list(range(chosen[0] * 8, chosen[0] * 8 + 8))
        result = trainer.train_step(next(trainer.loader))  # uids group the advantages: the step runs
        assert result.metrics and all(v == v for v in result.flat().values())
    finally:
        trainer.shutdown()


def test_a_share_of_two_gpus_is_split_over_two_workers(local_ray, tmp_path):
    """gpus_per_share=2: 2 workers generate together the slowest of 4 shares of 8 prompts (a run
    replayed whose rollout decoded each share on 2 GPUs), 4 prompts each, in share order."""
    from trainer.rollout.replay_shares import share_targets, slowest_shares

    cfg = build_config([
        *REPLAY, "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.target_lengths.slowest_of=4",
        "actor_rollout_ref.rollout.target_lengths.gpus_per_share=2",
    ])
    trainer = build_trainer(cfg, tmp_path)
    try:
        seed, spec = trainer._rollout_seed(), cfg.actor_rollout_ref.rollout.target_lengths
        (chosen,) = slowest_shares(trainer.spec.arch, spec, N, 8, 1, PROMPT, seed, CAP)
        assert chosen != 0, "the test's seed should pick another share than the first"
        batch = trainer.generate_sequences(next(trainer.loader))
        assert batch.response_mask.sum(dim=1).tolist() == share_targets(spec, N, chosen * 8, 8, seed, CAP)
        assert batch.uids.tolist() == [u for u in range(chosen * 8, chosen * 8 + 8) for _ in range(N)]
    finally:
        trainer.shutdown()
