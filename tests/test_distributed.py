"""Data parallelism over Ray: 2 workers on a 2-node local cluster take the same step as 1 worker.

The cluster is real (ray.cluster_utils.Cluster: a head and a second node, one CPU each), the
workers form a real gloo process group, and the batch is the same global batch: the static engine
keys each response's sampling noise by its row, so both layouts sample the same responses.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest
import ray
import torch
from adam_steps import assert_same_adam_steps, moments_from_state_dict

from trainer.build import build_trainer
from trainer.config import build_config
from trainer.driver.sharding import mini_batch_shards
from trainer.models.presets import build_model
from trainer.workers.fsdp import PolicyModel

COMMON = [
    "data.synthetic_difficulty=tiny",
    "data.train_batch_size=8",
    "data.max_response_length=6",
    "actor_rollout_ref.rollout.name=static",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # two optimizer steps in the update
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",  # uneven micro-batches on purpose
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.optim.lr=1e-2",
]


class Step(NamedTuple):
    metrics: dict
    state: dict  # updated model and optimizer
    responses: torch.Tensor
    nodes: list[str]  # the Ray node each worker ran on
    old_log_probs: torch.Tensor
    shards: list[list[int]]  # each worker's rows in the training phases


def one_step(overrides: list[str], workdir) -> Step:
    cfg = build_config(COMMON + overrides)
    trainer = build_trainer(cfg, workdir)
    try:
        result = trainer.train_step(next(trainer.loader))
        state = trainer.workers.rank0("state")
        nodes = ray.get(
            [
                w.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id())
                for w in trainer.workers.workers
            ]
        )
        batch = trainer.last_batch
        return Step(result.metrics, state, batch.response_ids, nodes, batch.old_log_probs, trainer.training_shards(batch))
    finally:
        trainer.shutdown()


@pytest.fixture(scope="module")
def step_of(two_node_cluster, tmp_path_factory: pytest.TempPathFactory):
    """``step_of(nodes, agg)``: one_step of ``nodes`` workers (one per node) with that loss_agg_mode, each
    run once for the module: a trainer's start costs seconds on a small machine."""
    done: dict[tuple[int, str], Step] = {}

    def step(nodes: int, agg: str) -> Step:
        if (nodes, agg) not in done:
            overrides = [
                f"trainer.nnodes={nodes}",
                "trainer.n_gpus_per_node=1",
                f"actor_rollout_ref.actor.loss_agg_mode={agg}",
            ]
            done[nodes, agg] = one_step(overrides, tmp_path_factory.mktemp("step"))
        return done[nodes, agg]

    return step


# Other loss_agg_modes across workers: tests/test_fsdp_gloo.py, whose rows have non-zero advantages (here
# every reward of this small run is 0, so every mode gave the same loss and gradients)
@pytest.mark.parametrize("agg", ["token-mean"])
def test_two_workers_take_the_same_step_as_one(step_of, agg):
    m1, s1, r1, _, logp1, _ = step_of(1, agg)
    m2, s2, r2, _, logp2, shards = step_of(2, agg)
    assert torch.equal(r1, r2), "the two layouts sampled different responses"
    # trainer.balance_batch (on by default) dealt the rows out by length, not in contiguous blocks, so
    # the comparison covers putting each worker's log-probs back in the batch's row order
    assert shards != mini_batch_shards(8 * 4, 4 * 4, 2), shards
    assert torch.allclose(logp1, logp2, rtol=1e-5, atol=1e-6), (logp1 - logp2).abs().max()
    assert m1["actor/pg_loss"] == pytest.approx(m2["actor/pg_loss"], rel=1e-4, abs=1e-6)
    assert m1["actor/grad_norm"] == pytest.approx(m2["actor/grad_norm"], rel=1e-4)
    assert m1["actor/grad_norm"] > 0
    # the same gradients (AdamW's first moments), and the same weights but for the step difference those
    # explain: where a gradient is ~0 its rounding noise decides Adam's step (tests/adam_steps.py)
    named = PolicyModel(build_model("tiny", seed=0))  # names the workers' optimizer state, by parameter order
    assert_same_adam_steps(
        s2["model"],
        s1["model"],
        moments_from_state_dict(s2["optimizer"], named),
        moments_from_state_dict(s1["optimizer"], named),
        lr=1e-2,
        moment_rtol=1e-4,
        weight_atol=1e-6,
        label="2 workers",
    )
    start = build_model("tiny", seed=build_config(COMMON).trainer.seed).state_dict()
    changed = sum(not torch.equal(start[k], value) for k, value in s1["model"].items())
    assert changed > 0, "the step did not change the weights: the comparison would be vacuous"


def test_workers_spread_over_both_nodes(step_of):
    node_ids = step_of(2, "token-mean").nodes  # the default loss_agg_mode: the same run as the test above
    assert len(node_ids) == 2 and len(set(node_ids)) == 2, node_ids
