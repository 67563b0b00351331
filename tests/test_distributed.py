"""Data parallelism over Ray: 2 workers on a 2-node local cluster take the same step as 1 worker.

The cluster is real (ray.cluster_utils.Cluster: a head and a second node, one CPU each), the
workers form a real gloo process group, and the batch is the same global batch: the static engine
keys each response's sampling noise by its row, so both layouts sample the same responses.
"""

from __future__ import annotations

import pytest
import ray
import torch
from adam_steps import assert_same_adam_steps, moments_from_state_dict

from trainer.build import build_trainer
from trainer.config import build_config
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


def one_step(overrides: list[str], workdir) -> tuple[dict, dict, torch.Tensor]:
    """Metrics, updated state (model and optimizer) and sampled responses of one training step."""
    cfg = build_config(COMMON + overrides)
    trainer = build_trainer(cfg, workdir)
    try:
        result = trainer.train_step(next(trainer.loader))
        state = trainer.workers.rank0("state")
        return result.metrics, state, trainer.last_batch.response_ids
    finally:
        trainer.shutdown()


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_two_workers_take_the_same_step_as_one(two_node_cluster, tmp_path, agg):
    mode = f"actor_rollout_ref.actor.loss_agg_mode={agg}"
    m1, s1, r1 = one_step(["trainer.nnodes=1", "trainer.n_gpus_per_node=1", mode], tmp_path)
    m2, s2, r2 = one_step(["trainer.nnodes=2", "trainer.n_gpus_per_node=1", mode], tmp_path)
    assert torch.equal(r1, r2), "the two layouts sampled different responses"
    assert m1["actor/pg_loss"] == pytest.approx(m2["actor/pg_loss"], rel=1e-4, abs=1e-6)
    assert m1["actor/grad_norm"] == pytest.approx(m2["actor/grad_norm"], rel=1e-4)
    assert m1["actor/grad_norm"] > 0
    # the same gradients (AdamW's first moments), and the same weights but for the step difference those
    # explain: where a gradient is ~0 its rounding noise decides Adam's step (tests/adam_steps.py)
    named = PolicyModel(build_model("tiny", seed=0))  # names the workers' optimizer state, by parameter order
    assert_same_adam_steps(
        s2["model"], s1["model"], moments_from_state_dict(s2["optimizer"], named),
        moments_from_state_dict(s1["optimizer"], named), lr=1e-2, moment_rtol=1e-4, weight_atol=1e-6, label="2 workers",
    )
    start = build_model("tiny", seed=build_config(COMMON).trainer.seed).state_dict()
    changed = sum(not torch.equal(start[k], value) for k, value in s1["model"].items())
    assert changed > 0, "the step did not change the weights: the comparison would be vacuous"


def test_workers_spread_over_both_nodes(two_node_cluster, tmp_path):
    cfg = build_config(COMMON + ["trainer.nnodes=2", "trainer.n_gpus_per_node=1"])
    trainer = build_trainer(cfg, tmp_path)
    try:
        node_ids = ray.get([w.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()) for w in trainer.workers.workers])
    finally:
        trainer.shutdown()
    assert len(set(node_ids)) == 2
