"""FSDP2 through the whole trainer on CPU: GRPO steps on a two-node local Ray cluster (gloo).

Whole steps with the fsdp2 strategy on one and two workers equal the dp strategy's step (responses,
metrics, weights), the fast engine included, and a checkpoint of the sharded state round-trips.
tests/test_fsdp_gloo.py checks the actor's FSDP paths (uneven shards, dummy micro-batches) directly.
"""

from __future__ import annotations

import pytest
import torch
from adam_steps import assert_same_adam_steps, moments_from_state_dict

from trainer.build import build_trainer
from trainer.config import build_config
from trainer.models.presets import build_model
from trainer.workers.distributed import DataParallel, Rendezvous
from trainer.workers.fsdp import PolicyModel, full_model_state, is_fsdp, shard_model

# ----------------------------------------------------------------------------- whole steps over Ray
COMMON = [
    "data.synthetic_difficulty=tiny",
    "data.train_batch_size=8",
    "data.max_response_length=6",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.optim.lr=1e-2",
]


def test_fsdp2_steps_equal_the_replicated_step(two_node_cluster, tmp_path):
    layouts = {
        "dp, 1 worker, static": ["actor_rollout_ref.actor.strategy=dp", "actor_rollout_ref.rollout.name=static"],
        "fsdp2, 1 worker, fast": ["actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.rollout.name=fast"],
        "fsdp2, 2 workers, fast": [
            "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.rollout.name=fast", "trainer.nnodes=2",
        ],
    }
    results = {}
    for label, overrides in layouts.items():
        cfg = build_config(COMMON + overrides + [f"trainer.default_local_dir={tmp_path / 'ckpt' / label.replace(' ', '')}"])
        trainer = build_trainer(cfg, tmp_path)
        try:
            assert {w["strategy"] for w in trainer.workers.info} == {overrides[0].split("=")[1]}
            result = trainer.train_step(next(trainer.loader))
            state = trainer.workers.all("state")[0]
            if trainer.workers.world_size == 2:
                path = trainer.save_checkpoint()
                trainer.workers.all("load_state", {"model": {k: v * 0 for k, v in state["model"].items()},
                                                   "optimizer": state["optimizer"]})
                assert all(float(v.abs().sum()) == 0 for v in trainer.workers.all("state")[0]["model"].values())
                trainer.load_checkpoint(path)
                reloaded = trainer.workers.all("state")[0]["model"]
                for name, value in state["model"].items():
                    assert torch.equal(reloaded[name], value), name
            results[label] = (result.metrics, state, trainer.last_batch.response_ids)
        finally:
            trainer.shutdown()
    (m0, s0, r0), *others = results.values()
    w0 = s0["model"]
    assert m0["actor/grad_norm"] > 0
    start = build_model("tiny", seed=build_config(COMMON).trainer.seed).state_dict()
    assert any(not torch.equal(start[k], w0[k]) for k in w0), "the step did not change the weights"
    # the optimizer states are keyed by parameter index (dp) or by name (fsdp2's full state dict)
    named = PolicyModel(build_model("tiny", seed=0))
    for label, (m, s, r) in list(results.items())[1:]:
        assert torch.equal(r, r0), f"{label}: sampled other responses"
        assert m["actor/pg_loss"] == pytest.approx(m0["actor/pg_loss"], rel=1e-4, abs=1e-6), label
        assert m["actor/grad_norm"] == pytest.approx(m0["actor/grad_norm"], rel=1e-4), label
        # the same gradients (AdamW's first moments), and the same weights but for the step difference
        # those explain: where a gradient is ~0 its rounding noise decides Adam's step (tests/adam_steps.py)
        assert_same_adam_steps(
            s["model"], w0, moments_from_state_dict(s["optimizer"], named),
            moments_from_state_dict(s0["optimizer"], named), lr=1e-2, moment_rtol=1e-4, label=label,
        )


def test_fsdp_modules_are_what_shard_model_made():
    # A process group of one (FSDP2 needs a group even for a single worker).
    dp = DataParallel(0, 1, torch.device("cpu"))
    rendezvous = Rendezvous("127.0.0.1")  # bound now: no free port that another process could take first
    dp.init("127.0.0.1", rendezvous.port, "gloo", force=True, rendezvous=rendezvous)
    try:
        policy = shard_model(PolicyModel(build_model("tiny", seed=0)), torch.device("cpu"), 1)
        assert is_fsdp(policy) and all(is_fsdp(layer) for layer in policy.lm.model.layers)
        whole = full_model_state(policy.lm)
        reference = build_model("tiny", seed=0).state_dict()
        assert whole.keys() == reference.keys()
        for name in whole:
            assert torch.equal(whole[name], reference[name]), name
    finally:
        dp.shutdown()
