"""The training phases' warm-up at set-up (trainer/workers/training_warm_up.py): it runs old_log_prob's,
ref's and update_actor's code, and leaves nothing that changes what a step then computes.

A GPU worker runs it in its set-up; on the CPU (no kernels to compile) the tests call it themselves,
on one worker with each strategy (dp, and FSDP2 over a gloo group of one, where FSDP2 keeps CPU
shards and its gather and gradient-sync switches do nothing: the calls that set them are checked)."""

from __future__ import annotations

import pytest
import torch

from trainer.batch import packing_pays
from trainer.config import build_config
from trainer.workers import actor as actor_module
from trainer.workers import training_warm_up
from trainer.workers.fsdp import PolicyModel, local_tensor
from trainer.workers.phase_spans import worker_spans
from trainer.workers.train_worker import TrainWorker
from trainer.workers.training_warm_up import rows_of_lengths, warm_up_mini_batches, warm_up_plan


@pytest.mark.parametrize(
    "prompt,max_response,expected",
    [
        # VERL's 1.5B replay: lone rows of 2,036 and 2,048 tokens, equal pairs of them, packed pairs of
        # 2,208 and 2,200 tokens
        (148, 27648, [[[1888], [1900]], [[1888, 1888], [1900, 1900]], [[1900, 12], [1900, 4]]]),
        (256, 1024, [[[1024], [1023]], [[1024, 1024], [1023, 1023]], [[1024, 16], [1024, 15]]]),  # step16x8
        (2048, 1024, [[[32], [31]], [[32, 32], [31, 31]], [[32, 16], [32, 15]]]),  # past the budget: 32 tokens
        (8, 16, [[[16], [8]], [[16, 16], [8, 8]], [[16, 15]]]),  # no short row of the other pair's class fits
        (15, 1, [[[1]], [[1, 1]]]),  # one response token: no pair to pack
        (20, 3, [[[3]], [[3, 3]]]),  # neither class of lone row within reach: the longest row alone
    ],
)
def test_the_plan(prompt, max_response, expected):
    assert warm_up_plan(prompt, max_response) == expected


@pytest.mark.parametrize("prompt", [148, 149, 256, 1000, 1024])
def test_the_plan_meets_both_classes_of_each_count_in_each_path(prompt):
    """Triton compiles a kernel for each class of its integer arguments (a multiple of 16 or not): the
    lone rows and the packed pairs meet both classes of their token counts, rows with prompts and
    responses alone, and the pairs pack."""
    lone, equal, packed = warm_up_plan(prompt, 27648)
    responses = [micro[0] for micro in lone]
    assert equal == [[r, r] for r in responses]
    for counts in ([r % 16 == 0 for r in responses], [(prompt + r) % 16 == 0 for r in responses],
                   [sum(p) % 16 == 0 for p in packed], [(2 * prompt + sum(p)) % 16 == 0 for p in packed]):
        assert sorted(counts) == [False, True], (prompt, lone, packed)
    for pair in packed:
        assert packing_pays([prompt + r for r in pair]), pair
        assert all(1 <= r <= 27648 for r in pair)
    assert max(prompt + r for mini in (lone, packed) for micro in mini for r in micro) <= 2048


def test_mini_batches_are_the_plans_rows_in_order():
    got = warm_up_mini_batches([[[5], [3]], [[2, 4], [1, 6]]], 4, 50, torch.Generator().manual_seed(0))
    assert [(rows.response_lengths.tolist(), size) for rows, size in got] == [([5, 3], 1), ([2, 4, 1, 6], 2)]
    with pytest.raises(ValueError, match="micro-batches differ in size"):
        warm_up_mini_batches([[[5], [3, 2]]], 4, 50, torch.Generator().manual_seed(0))


def test_the_throwaway_step_leaves_the_optimizer_as_it_was():
    model = torch.nn.Linear(3, 2).to(torch.float64)
    real = torch.optim.AdamW([*model.parameters(), torch.nn.Parameter(torch.ones(2))], lr=0.5, betas=(0.8, 0.9),
                             weight_decay=0.3, foreach=True)
    before = [p.detach().clone() for group in real.param_groups for p in group["params"]]
    twin = training_warm_up.throwaway_step(real)
    assert not real.state, "the real optimizer created state"
    after = [p for group in real.param_groups for p in group["params"]]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    # its own kind and settings, one small tensor per dtype of the real parameters, stepped once
    assert type(twin) is torch.optim.AdamW and twin.defaults == real.defaults
    stepped = [p for group in twin.param_groups for p in group["params"]]
    assert sorted(str(p.dtype) for p in stepped) == ["torch.float32", "torch.float64"]
    assert all(float(twin.state[p]["step"]) == 1 for p in stepped)


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
    _, metrics = worker_spans(worker.update_actor(batch, 1))  # its figures; the phases' spans are times of day
    return batch.old_log_probs, batch.ref_log_probs, metrics, worker.state()["model"]


def _weights(worker: TrainWorker) -> dict[str, torch.Tensor]:
    """The actor's parameters as this worker holds them (its shards under FSDP2), copied. Not
    worker.state(): its optimizer state dict creates AdamW's state where none is yet."""
    return {name: local_tensor(p).detach().clone() for name, p in worker.actor.named_parameters()}


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
        warmed, plans = warm._warm_up_training()
        assert warmed > 0 and plans == 0.0, (warmed, plans)  # no row here can attend alone: no plan built
        # three mini-batches of two micro-batches (lone rows, equal pairs, packed pairs): log-probs by
        # both models, then the actor's loss and backward, the gradients synchronised after the second
        assert forwards == {"actor": 12, "ref": 6} and had_gradients == [True, True, True]
        # the packed pairs (8 + 24 and 8 + 7 response tokens after prompts of 8) by the actor, the ref, the update
        assert sorted(map(tuple, packed)) == [(32, 15)] * 3 + [(32, 16)] * 3, packed
        assert syncs == [False, True] * 3, "the warm-up's gradient sync differs from update_actor's"
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
