"""Batch.select: the rows asked for, and with ``only`` the fields a phase's workers read, no more."""

from __future__ import annotations

import pickle

import pytest
import torch

from trainer.batch import ROW_FIELDS, Batch
from trainer.driver.grpo_trainer import UPDATE_INPUTS


def _batch(rows: int = 4, width: int = 6) -> Batch:
    g = torch.Generator().manual_seed(0)
    full = {
        name: torch.randn(rows, width, generator=g)
        for name in ("rollout_log_probs", "token_level_scores", "token_level_rewards", "old_log_probs",
                     "ref_log_probs", "advantages", "returns")
    }
    return Batch(
        prompt_ids=torch.randint(0, 100, (rows, 3), generator=g),
        prompt_mask=torch.ones(rows, 3, dtype=torch.long),
        response_ids=torch.randint(0, 100, (rows, width), generator=g),
        response_mask=torch.ones(rows, width, dtype=torch.long),
        uids=torch.arange(rows) // 2,
        ground_truths=[str(i) for i in range(rows)],
        scores=torch.randn(rows, generator=g),
        **full,
    )


def test_select_keeps_every_field_of_the_rows_in_their_order() -> None:
    batch = _batch()
    part = batch.select([3, 1])
    for name, tensor in batch.tensors().items():
        assert torch.equal(part.tensors()[name], tensor[[3, 1]]), name
    assert part.ground_truths == ["3", "1"]


def test_select_only_ships_the_rows_and_the_named_fields() -> None:
    batch = _batch()
    part = batch.select([2, 0], only=UPDATE_INPUTS)
    assert set(part.tensors()) == ROW_FIELDS | set(UPDATE_INPUTS)
    for name in ROW_FIELDS | set(UPDATE_INPUTS):
        assert torch.equal(part.tensors()[name], batch.tensors()[name][[2, 0]]), name
    assert part.rollout_log_probs is None and part.returns is None and part.ground_truths == []
    # what a worker is sent: the rows alone for the log-prob phases, about a third of the full rows' bytes here
    rows_only = len(pickle.dumps(batch.select([0, 1, 2, 3], only=())))
    assert rows_only < 0.5 * len(pickle.dumps(batch.select([0, 1, 2, 3]))), rows_only


def test_select_only_refuses_a_field_the_batch_does_not_have() -> None:
    with pytest.raises(ValueError, match="no field \\['old_logprobs'\\]"):
        _batch().select([0], only=("old_logprobs",))
