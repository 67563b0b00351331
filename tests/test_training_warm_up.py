"""The training phases' warm-up at set-up (trainer/workers/training_warm_up.py): it runs old_log_prob's,
ref's and update_actor's code, and leaves nothing that changes what a step then computes.

A GPU worker runs it in its set-up; on the CPU (no kernels to compile) the tests call it themselves,
on one worker with each strategy (dp, and FSDP2 over a gloo group of one, where FSDP2 keeps CPU
shards and its gather and gradient-sync switches do nothing: the calls that set them are checked)."""

from __future__ import annotations

import pytest
import torch

from trainer.config import build_config
from trainer.workers import actor as actor_module
from trainer.workers import training_warm_up
from trainer.workers.fsdp import PolicyModel
from trainer.workers.train_worker import TrainWorker
from trainer.workers.training_warm_up import rows_of_lengths, warm_up_response_lengths


@pytest.mark.parametrize(
    "prompt,max_response,expected",
    [
        (148, 27648, [1900, 1899, 949]),  # VERL's 1.5B replay: a lone row of 2,048 tokens, a pair of 2,047 + 1,097
        (256, 1024, [1024, 1023, 511]),  # step16x8
        (2048, 1024, [32, 31, 15]),  # a prompt past the budget still leaves 32 response tokens
        (8, 16, [8, 16, 8]),
        (15, 1, [1]),  # one response token: a row of 16, no row of the other class
        (20, 3, [3]),  # no multiple of 16 within reach: the longest row alone
    ],
)
def test_a_lone_row_of_a_multiple_of_16_tokens_and_a_pair_that_is_not(prompt, max_response, expected):
    lengths = warm_up_response_lengths(prompt, max_response)
    assert lengths == expected
    assert all(1 <= n <= max_response for n in lengths)
    if len(lengths) == 3:  # Triton specialises an integer on being a multiple of 16: both classes met
        lone, *pair = lengths
        assert (prompt + lone) % 16 == 0 and (2 * prompt + sum(pair)) % 16 != 0


def test_rows_of_lengths_hold_exactly_those_response_tokens():
    rows = rows_of_lengths([5, 1, 3], prompt_length=4, vocab=50, generator=torch.Generator().manual_seed(0))
    assert rows.response_lengths.tolist() == [5, 1, 3] and rows.prompt_lengths.tolist() == [4, 4, 4]
    assert int(rows.response_ids[1, 1:].abs().sum()) == 0  # padding after a row's end
    assert int(rows.input_ids.max()) < 50


def _worker(strategy: str) -> TrainWorker:
    cfg = build_config([
        "actor_rollout_ref.model.path=tiny", f"actor_rollout_ref.actor.strategy={strategy}",
        "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "data.max_prompt_length=8",
        "data.max_response_length=24", "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.model.use_remove_padding=True",
    ])
    worker = TrainWorker(cfg, rank=0, world_size=1)
    worker.setup(*worker.address())
    return worker


def _step(worker: TrainWorker) -> tuple[torch.Tensor, torch.Tensor, dict, dict]:
    batch = rows_of_lengths([9, 24, 3, 17], prompt_length=8, vocab=len(worker.tokenizer),
                            generator=torch.Generator().manual_seed(7), uids=torch.tensor([0, 0, 1, 1]))
    batch.old_log_probs = worker.compute_old_log_prob(batch)
    batch.ref_log_probs = worker.compute_ref_log_prob(batch)
    batch.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None].expand_as(batch.old_log_probs).clone()
    metrics = worker.update_actor(batch, 1)
    return batch.old_log_probs, batch.ref_log_probs, metrics, worker.state()["model"]


def _weights(worker: TrainWorker) -> dict[str, torch.Tensor]:
    """The actor's parameters as this worker holds them (its shards under FSDP2), copied. Not
    worker.state(): its optimizer state dict creates AdamW's state where none is yet."""
    return {name: getattr(p, "_local_tensor", p).detach().clone() for name, p in worker.actor.named_parameters()}


@pytest.mark.parametrize("strategy", ["dp", "fsdp2"])
def test_a_warmed_worker_computes_the_step_of_a_cold_one(strategy, monkeypatch):
    cold = _worker(strategy)
    try:
        want = _step(cold)
    finally:
        cold.shutdown()

    forwards = {"actor": 0, "ref": 0}
    had_gradients, packed, syncs = [], [], []
    gradients = training_warm_up.mini_batch_gradients
    packed_hidden = PolicyModel._packed_hidden
    accumulate = actor_module.accumulate_gradients

    def watched(model, *args):
        gradients(model, *args)
        had_gradients.append(any(p.grad is not None and bool(p.grad.abs().sum()) for p in model.parameters()))

    def watched_packing(self, *args):
        packed.append(args[-1])  # the packed rows' lengths
        return packed_hidden(self, *args)

    monkeypatch.setattr(training_warm_up, "mini_batch_gradients", watched)
    monkeypatch.setattr(PolicyModel, "_packed_hidden", watched_packing)
    monkeypatch.setattr(actor_module, "accumulate_gradients", lambda m, last_micro_batch: (
        syncs.append(last_micro_batch), accumulate(m, last_micro_batch=last_micro_batch)))
    warm = _worker(strategy)
    try:
        warm.actor.register_forward_pre_hook(lambda *_: forwards.__setitem__("actor", forwards["actor"] + 1))
        warm.ref.register_forward_pre_hook(lambda *_: forwards.__setitem__("ref", forwards["ref"] + 1))
        before, rng = _weights(warm), torch.get_rng_state()
        assert warm._warm_up_training() > 0
        # two micro-batches (the pair, packed, and the lone row): log-probs by both models, then the
        # actor's loss and backward on each as its own mini-batch, its gradients synchronised at once
        assert forwards == {"actor": 4, "ref": 2} and had_gradients == [True, True]
        assert len(packed) == 3 and all(len(lengths) == 2 for lengths in packed), packed  # actor, ref, update
        assert syncs == [True, True], "a warm-up backward left FSDP's gradient sync off"
        assert torch.equal(torch.get_rng_state(), rng), "the warm-up moved the CPU generator"
        assert all(p.grad is None for p in warm.actor.parameters()), "the warm-up's gradients were kept"
        assert not warm.optimizer.state, "the warm-up stepped the optimizer"
        after = _weights(warm)
        changed = [k for k in before if not torch.equal(before[k], after[k])]
        assert not changed, f"the warm-up changed weights: {changed[:3]}"
        got = _step(warm)
    finally:
        warm.shutdown()
    for name, a, b in zip(("old_log_prob", "ref"), want[:2], got[:2], strict=True):
        assert torch.equal(a, b), f"{name} differs after the warm-up: max {float((a - b).abs().max()):.3g}"
    assert want[2] == got[2], "update_actor's metrics differ after the warm-up"
    differs = [k for k in want[3] if not torch.equal(want[3][k], got[3][k])]
    assert not differs, f"the updated weights differ after the warm-up: {differs[:3]}"
