"""The training phases' first-call costs paid at set-up: a short old_log_prob, ref and backward.

Why: a process's first forward and backward compile Triton kernels that ~/.triton lacks (liger-kernel's
RMSNorm, SwiGLU and RoPE, the LM head's log-prob kernels) and set up cuDNN's attention plans. VERL's
published step times come from a run of many steps, where these costs are long paid; a one-step
replay (``--rl-warmup-rounds 0``) would time them inside its only step: on VERL's 1.5B replay on one
H200 with a cold cache, old_log_prob took 13.6 s and update_actor 40.0 s without this warm-up, 10.4
and 35.8 s with it, which took 9.2 s of set-up (docs/benchmarks.md). So each GPU worker runs, at set-up and outside every timed phase, the
three training phases' code on three short rows and throws the results away:

- log-probs by the actor and by the ref (the code of old_log_prob and ref), in two micro-batches:
  one row alone, and two rows of unequal lengths, which with ``use_remove_padding`` are packed where
  packing pays (trainer.batch.packing_pays; a step meets both: a long row alone, rows packed together);
- the actor's loss and backward on the same two micro-batches, each its own mini-batch (so each
  backward reduce-scatters at once and no unsharded gradient is held across them), the gradients
  dropped after each. No optimizer step: the weights, the optimizer's state and its step count stay
  as they were; the random number generators' states are restored.

Triton specialises a kernel's integer arguments on whether they are a multiple of 16, so the lone
row's token count is a multiple of 16 and the pair's is not. The rows' values do not matter.
"""

from __future__ import annotations

import dataclasses

import torch

from trainer.batch import Batch
from trainer.config import ActorConfig
from trainer.workers.actor import (
    UpdateMetrics,
    UpdateSettings,
    compute_log_probs,
    micro_batch_groups,
    mini_batch_gradients,
)
from trainer.workers.distributed import DataParallel

RESPONSE_BUDGET = 2048  # response tokens of the longest warm-up row (fewer after a long prompt, at least 32)


def warm_up_response_lengths(prompt_length: int, max_response_length: int, budget: int = RESPONSE_BUDGET) -> list[int]:
    """Response lengths of the warm-up's rows after prompts of ``prompt_length``: first the lone row,
    whose row (prompt and response) is a multiple of 16 tokens, then the packed pair, a row as long
    and one about half as long, together not a multiple of 16. At most ``max_response_length`` each;
    fewer rows where the limits leave no room for a class."""
    cap = min(max_response_length, max(budget - prompt_length, 32))

    def longest(aligned: bool) -> int | None:  # the longest response up to cap whose row is (not) aligned
        return next((r for r in range(cap, max(cap - 16, 0), -1) if ((prompt_length + r) % 16 == 0) == aligned), None)

    lone, other = longest(True), longest(False)
    if lone is None or other is None:  # too short for both classes: the longest row alone
        return [cap]
    half = max(1, other // 2)
    pair = [other, half] if (2 * prompt_length + other + half) % 16 else [other, max(1, half - 1)]
    return [lone, *pair] if pair[0] != pair[1] else [lone, other]


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
    """old_log_prob's, ref's and update_actor's code on ``rows`` (warm_up_response_lengths' order: the
    lone row, then the pair), in two micro-batches; nothing kept.

    Every worker of an FSDP group must call it with the same rows (its forwards are collectives)."""
    device = settings.device
    ordered = rows.select([1, 2, 0]) if rows.size == 3 else rows  # the pair first: micro-batches are consecutive rows
    size = 2 if rows.size == 3 else 1  # the pair, then the lone row; else a row each
    one_micro_batch = dataclasses.replace(actor_cfg, ppo_micro_batch_size_per_gpu=size, use_dynamic_bsz=False)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        old = compute_log_probs(actor, ordered, settings.temperature, size, False, 0, dp, device)  # [B, R]
        ref_lp = compute_log_probs(ref, ordered, settings.temperature, size, False, 0, dp, device) if ref is not None else old
        work = dataclasses.replace(ordered, old_log_probs=old, ref_log_probs=ref_lp, advantages=torch.ones_like(old))
        was_training = actor.training
        actor.train()
        try:
            # each of the log-prob passes' micro-batches is a mini-batch here: its gradients reduced and dropped at once
            for group in micro_batch_groups(ordered, size, False, 0, dp):
                mini_batch_gradients(actor, work.select(group), one_micro_batch, settings, dp, UpdateMetrics())
                optimizer.zero_grad(set_to_none=True)
        finally:
            optimizer.zero_grad(set_to_none=True)  # the update's gradients start from none, as before
            actor.train(was_training)
