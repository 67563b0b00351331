"""One benchmark per phase of a GRPO step, each timed on the batch that a warm-up step produced.

Run on the embedded default with ``pytest suites/``; a phase the trainer cannot time (no reference
model, or a phase another framework does not separate) is skipped by the plugin with the reason
(pytest_rlbench/frameworks/phase_skips.py). Every test's rounds are compared with the
baselines at the end of the session (``--rl-baseline``; default: VERL's and RLinf's published runs as
references). The work comes from the trainer's configuration: ``--rl-config data.train_batch_size=...``,
``actor_rollout_ref.rollout.n=...``, ``data.max_response_length=...`` and the other VERL keys.
"""

from __future__ import annotations

import copy

import pytest


@pytest.mark.rl_phase("reshard")
def test_reshard(rl_trainer, rl_bench):
    """Weight sync: the actor's weights into each worker's rollout engine."""
    rl_bench(rl_trainer.reshard)


@pytest.mark.rl_phase("generate_sequences")
def test_generate_sequences(rl_trainer, rl_prompts, rl_bench):
    """rollout.n responses to each prompt of the warm-up batch (the same prompts every round)."""
    batch = rl_bench(lambda: rl_trainer.generate_sequences(rl_prompts), tokens=rl_trainer.batch_tokens)
    assert batch.size == len(rl_prompts) * rl_trainer.cfg.actor_rollout_ref.rollout.n


@pytest.mark.rl_phase("gen")
def test_gen(rl_trainer, rl_prompts, rl_bench):
    """VERL's gen: reshard, then generate_sequences."""

    def gen():
        rl_trainer.reshard()
        return rl_trainer.generate_sequences(rl_prompts)

    rl_bench(gen, tokens=rl_trainer.batch_tokens)


@pytest.mark.rl_phase("reward")
def test_reward(rl_trainer, rl_batch, rl_bench):
    batch = rl_bench(lambda: rl_trainer.compute_reward(copy.copy(rl_batch.batch)), tokens=rl_batch.tokens)
    assert batch.token_level_scores.shape == batch.response_ids.shape


@pytest.mark.rl_phase("old_log_prob")
def test_old_log_prob(rl_trainer, rl_batch, rl_bench):
    logp = rl_bench(lambda: rl_trainer.compute_old_log_prob(rl_batch.batch), tokens=rl_batch.tokens)
    assert logp.shape == rl_batch.batch.response_ids.shape


@pytest.mark.rl_phase("ref")
def test_ref(rl_trainer, rl_batch, rl_bench):
    """The reference model's log-probs (skipped by the plugin without one: set use_kl_loss=True)."""
    logp = rl_bench(lambda: rl_trainer.compute_ref_log_prob(rl_batch.batch), tokens=rl_batch.tokens)
    assert logp.shape == rl_batch.batch.response_ids.shape


@pytest.mark.rl_phase("adv")
def test_adv(rl_trainer, rl_batch, rl_bench):
    batch, _ = rl_bench(lambda: rl_trainer.compute_advantage(copy.copy(rl_batch.batch)), tokens=rl_batch.tokens)
    assert batch.advantages.shape == batch.response_ids.shape


@pytest.mark.rl_phase("update_actor")
def test_update_actor(rl_trainer, rl_batch, rl_bench):
    """One PPO update over the warm-up batch (ppo_epochs over its mini-batches), every round."""
    metrics = rl_bench(lambda: rl_trainer.update_actor(rl_batch.batch), tokens=rl_batch.tokens)
    assert metrics["actor/grad_norm"] >= 0


@pytest.mark.rl_phase("save_checkpoint")
def test_save_checkpoint(rl_trainer, rl_batch, rl_bench):
    """An atomic checkpoint of model, optimizer and data state (into the session's temp dir)."""
    path = rl_bench(rl_trainer.save_checkpoint, tokens=rl_batch.tokens)
    assert (path / "manifest.json").is_file()
