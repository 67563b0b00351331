"""The actor's loss weights: a batch cut into micro-batches (or workers' shards) takes the step of the
whole batch, in every loss_agg_mode, Dr.GRPO's seq-mean-token-sum-norm included.

tests/test_fsdp_gloo.py checks the same property with two real processes; here the arithmetic of
the weights on its own, and one whole PPO update of a tiny model on one process.
"""

from __future__ import annotations

import pytest
import torch
from adam_steps import adam_moments, assert_same_adam_steps

from trainer.algorithms.aggregation import LOSS_AGG_MODES, agg_loss
from trainer.algorithms.policy_loss import vanilla_policy_loss
from trainer.batch import Batch, left_pad
from trainer.config import ActorConfig
from trainer.models.presets import build_model
from trainer.workers.actor import UpdateSettings, compute_log_probs, loss_normaliser, update_policy
from trainer.workers.distributed import DataParallel
from trainer.workers.fsdp import PolicyModel

MAX_LEN = 8
# Responses of 0 to 5 tokens: row 2 is empty (no weight in any seq-mean mode).
LENGTHS = [4, 1, 0, 5, 2, 3]
# Micro-batches over two "workers": worker 0 holds rows 0-2, worker 1 rows 3-5.
PIECES = [[0, 1], [2], [3], [4, 5]]
LR = 1e-2  # AdamW's, in the one-update test


def _mask(lengths: list[int], width: int) -> torch.Tensor:
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()


@pytest.mark.parametrize("mode", list(LOSS_AGG_MODES))
def test_weighted_micro_batch_losses_sum_to_the_whole_batch_loss(mode: str) -> None:
    torch.manual_seed(0)
    loss_mat = torch.randn(len(LENGTHS), 5, dtype=torch.float64, requires_grad=True)
    mask = _mask(LENGTHS, 5)
    whole = agg_loss(loss_mat, mask, mode, MAX_LEN)
    (whole_grad,) = torch.autograd.grad(whole, loss_mat)

    # What update_policy does: the global normaliser is the all-reduced sum of the pieces' own.
    global_norm = sum(loss_normaliser(mode, mask[rows]) for rows in PIECES)
    total = sum(
        agg_loss(loss_mat[rows], mask[rows], mode, MAX_LEN) * loss_normaliser(mode, mask[rows]) / global_norm
        for rows in PIECES
    )
    (total_grad,) = torch.autograd.grad(total, loss_mat)
    assert total.item() == pytest.approx(whole.item(), rel=1e-12)
    torch.testing.assert_close(total_grad, whole_grad)


def test_sum_norm_weights_count_only_non_empty_sequences() -> None:
    # Dr.GRPO divides by the number of sequences G, each with at least one token here.
    mask = _mask([3, 0, 1], 4)
    assert loss_normaliser("seq-mean-token-sum-norm", mask) == 2.0
    assert loss_normaliser("seq-mean-token-mean", mask) == 2.0
    assert loss_normaliser("token-mean", mask) == 4.0


def _toy_batch() -> Batch:
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(5, 100, (n,), generator=g).tolist() for n in (3, 5, 2, 4, 6, 3)]
    prompt_ids, prompt_mask = left_pad(prompts, 0)
    response_mask = _mask(LENGTHS, MAX_LEN)
    return Batch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=torch.randint(5, 100, (len(LENGTHS), MAX_LEN), generator=g) * response_mask,
        response_mask=response_mask,
        uids=torch.arange(len(LENGTHS)) // 2,
        advantages=torch.randn(len(LENGTHS), MAX_LEN, generator=g) * response_mask,
    )


def _one_update(micro_batch_size: int) -> tuple[PolicyModel, dict[str, float], float, dict]:
    """One PPO step of a tiny model on the toy batch: (model, metrics, the whole batch's loss before
    it, AdamW's moments after it by parameter name)."""
    cfg = ActorConfig(ppo_micro_batch_size_per_gpu=micro_batch_size, loss_agg_mode="seq-mean-token-sum-norm")
    model = PolicyModel(build_model("tiny", seed=0))
    batch = _toy_batch()
    logp = compute_log_probs(model, batch, 1.0, micro_batch_size, False, 0, DataParallel(), torch.device("cpu"))
    batch.old_log_probs = logp - 0.05 * batch.response_mask  # a ratio away from 1
    pg = vanilla_policy_loss(logp, batch.old_log_probs, batch.advantages, batch.response_mask.float())
    expected = agg_loss(pg.pg_losses, batch.response_mask, "seq-mean-token-sum-norm", MAX_LEN).item()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    settings = UpdateSettings(temperature=1.0, max_response_length=MAX_LEN, n_mini_batches=1, device=torch.device("cpu"))
    metrics = update_policy(model, optimizer, batch, cfg, settings, DataParallel())
    return model, metrics, expected, adam_moments(model, optimizer)


def test_sum_norm_update_takes_the_whole_batch_loss_in_any_micro_batching() -> None:
    whole_model, whole_metrics, expected, whole_moments = _one_update(micro_batch_size=len(LENGTHS))
    # Dr.GRPO's mean over the 5 non-empty sequences, not over all 6 rows (nor their sum).
    assert whole_metrics["actor/pg_loss"] == pytest.approx(expected, rel=1e-4)
    micro_model, micro_metrics, _, micro_moments = _one_update(micro_batch_size=2)
    assert micro_metrics["actor/pg_loss"] == pytest.approx(expected, rel=1e-4)
    assert micro_metrics["actor/grad_norm"] == pytest.approx(whole_metrics["actor/grad_norm"], rel=1e-4)
    # the same gradients (AdamW's first moments), and the same weights but for the step difference those
    # explain: where a gradient is ~0, its rounding noise (summation order, the host's SIMD width)
    # decides Adam's step (tests/adam_steps.py)
    assert_same_adam_steps(micro_model.lm.state_dict(), whole_model.lm.state_dict(), micro_moments, whole_moments, lr=LR)
