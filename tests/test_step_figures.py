"""trainer.driver.step_figures.batch_tokens: token counts and decode steps of a rollout batch, by hand."""

from __future__ import annotations

import torch

from trainer.batch import Batch
from trainer.driver.step_figures import batch_tokens


def make_batch(prompt_lengths: list[int], response_lengths: list[int]) -> Batch:
    width_p, width_r = max(prompt_lengths), max(response_lengths)
    prompt_mask = torch.tensor([[0] * (width_p - p) + [1] * p for p in prompt_lengths])
    response_mask = torch.tensor([[1] * r + [0] * (width_r - r) for r in response_lengths])
    return Batch(
        prompt_ids=torch.zeros_like(prompt_mask),
        prompt_mask=prompt_mask,
        response_ids=torch.zeros_like(response_mask),
        response_mask=response_mask,
        uids=torch.arange(len(prompt_lengths)),
    )


def test_decode_steps_sum_each_workers_longest_response():
    # 3 prompts x n=2; 2 workers take prompts [0, 1] and [2] (even_split):
    # worker 0 decodes max(3, 5, 2, 4) = 5 steps, worker 1 max(7, 1) = 7 -> 12
    batch = make_batch([4, 4, 6, 6, 2, 2], [3, 5, 2, 4, 7, 1])
    counts = batch_tokens(batch, n=2, world_size=2)
    assert counts.decode_steps == 12
    assert (counts.prompt_tokens, counts.response_tokens, counts.num_sequences) == (24, 22, 6)
    assert counts.response_lengths == [3, 5, 2, 4, 7, 1]
    assert batch_tokens(batch, n=2, world_size=1).decode_steps == 7  # one worker: the longest of all


def test_a_decode_group_decodes_its_workers_prompts_together():
    # 6 prompts x n=1 over 4 workers: [0, 1], [2, 3], [4], [5] (even_split); in groups of 2 workers
    # the groups hold prompts 0-3 and 4-5, not 3 and 3, and each decodes for its longest row
    batch = make_batch([4] * 6, [9, 1, 1, 1, 1, 8])
    assert batch_tokens(batch, n=1, world_size=4, group_size=2).decode_steps == 9 + 8
    assert batch_tokens(batch, n=1, world_size=4).decode_steps == 9 + 1 + 1 + 8
    assert batch_tokens(batch, n=1, world_size=4, group_size=4).decode_steps == 9


def test_record_token_counts_keep_every_field_the_trainer_counted():
    from pytest_rlbench.session.bench import token_counts

    counts = batch_tokens(make_batch([4, 6], [3, 5]), n=1, world_size=1)
    record = token_counts(counts)
    assert (record.num_sequences, record.prompt_tokens, record.response_tokens, record.decode_steps) == (2, 10, 8, 5)
    assert record.response_lengths == [3, 5] and record.prompt_length_mean == 5.0
