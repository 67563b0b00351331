"""The training phases' first-call costs paid at set-up: a short old_log_prob, ref and backward.

Why: a process's first forward and backward compile Triton kernels that ~/.triton lacks (liger-kernel's
RMSNorm, SwiGLU and RoPE, the LM head's log-prob kernels) and set up cuDNN's attention plans. VERL's
published step times come from a run of many steps, where these costs are long paid; a one-step
replay (``--rl-warmup-rounds 0``) would time them inside its only step: on VERL's 1.5B replay on one
H200 with a cold cache, old_log_prob took 13.6 s and update_actor 40.0 s without this warm-up, 10.4
and 35.8 s with it, which took 9.2 s of set-up (docs/benchmarks.md). So each GPU worker runs, at set-up and outside every timed phase, the
three training phases' code on two short rows, each its own micro-batch, and throws the results away:

- log-probs by the actor and by the ref (the code of old_log_prob and ref);
- the actor's loss and backward over both rows (update_actor's code), then the gradients dropped.
  No optimizer step: the weights, the optimizer's state and its step count stay as they were.

Triton specialises a kernel's integer arguments on whether they are a multiple of 16, so one row's
token count is a multiple of 16 and the other's is not. The rows' values do not matter (random ids).
"""

from __future__ import annotations

import dataclasses

import torch

from trainer.batch import Batch
from trainer.config import ActorConfig
from trainer.workers.actor import UpdateMetrics, UpdateSettings, compute_log_probs, mini_batch_gradients
from trainer.workers.distributed import DataParallel

TOKEN_BUDGET = 2048  # tokens of the longer warm-up row: enough for every kernel, short enough to cost ~1 s


def warm_up_response_lengths(prompt_length: int, max_response_length: int, budget: int = TOKEN_BUDGET) -> list[int]:
    """Response lengths of the warm-up's rows after prompts of ``prompt_length``: one whose row (prompt
    and response) is a multiple of 16 tokens and one that is not, each at most ``max_response_length``;
    fewer where the limits leave no room (a row needs at least one response token)."""
    longest = min(budget, prompt_length + max_response_length)
    aligned = longest // 16 * 16  # a multiple of 16 tokens
    lengths = [aligned - prompt_length, aligned - 17 - prompt_length]  # the second: 15 mod 16
    if aligned - prompt_length < 1:  # no multiple of 16 fits: the longest row, whatever its class
        lengths = [longest - prompt_length]
    return [n for n in lengths if n >= 1]


def rows_of_lengths(
    response_lengths: list[int], prompt_length: int, vocab: int, generator: torch.Generator,
    uids: torch.Tensor | None = None,
) -> Batch:
    """Rows of the given response lengths after full prompts of ``prompt_length`` tokens, random ids:
    a training phase's work for rows of those lengths (the ids' values do not change it)."""
    rows, width = len(response_lengths), max(response_lengths)
    response_mask = (torch.arange(width)[None, :] < torch.tensor(response_lengths)[:, None]).long()  # [B, R]
    return Batch(
        prompt_ids=torch.randint(0, vocab, (rows, prompt_length), generator=generator),  # [B, P]
        prompt_mask=torch.ones(rows, prompt_length, dtype=torch.long),  # [B, P]
        response_ids=torch.randint(0, vocab, (rows, width), generator=generator) * response_mask,  # [B, R]
        response_mask=response_mask,
        uids=torch.arange(rows) if uids is None else uids,
    )


def warm_up_training(
    actor: torch.nn.Module,
    ref: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer,
    rows: Batch,
    actor_cfg: ActorConfig,
    settings: UpdateSettings,
    dp: DataParallel,
) -> None:
    """old_log_prob's, ref's and update_actor's code on ``rows``, one row a micro-batch; nothing kept.

    Every worker of an FSDP group must call it with as many rows (its forwards are collectives)."""
    device = settings.device
    old = compute_log_probs(actor, rows, settings.temperature, 1, False, 0, dp, device)  # [B, R]
    ref_lp = compute_log_probs(ref, rows, settings.temperature, 1, False, 0, dp, device) if ref is not None else old
    work = dataclasses.replace(rows, old_log_probs=old, ref_log_probs=ref_lp, advantages=torch.ones_like(old))
    one_row_each = dataclasses.replace(actor_cfg, ppo_micro_batch_size_per_gpu=1, use_dynamic_bsz=False)
    was_training = actor.training
    actor.train()
    try:
        mini_batch_gradients(actor, work, one_row_each, settings, dp, UpdateMetrics())
    finally:
        optimizer.zero_grad(set_to_none=True)  # the update's gradients start from none, as before
        actor.train(was_training)
