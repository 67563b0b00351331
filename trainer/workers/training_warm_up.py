"""The training phases' first-call costs paid at set-up: a short old_log_prob, ref and backward.

Why: a process's first forward and backward compile Triton kernels that ~/.triton lacks (liger-kernel's
RMSNorm, SwiGLU and RoPE, the LM head's log-prob kernels) and load cuDNN's attention (0.9 s). VERL's
published step times come from a run of many steps, where these costs are long paid; a one-step
replay (``--rl-warmup-rounds 0``) would time them inside its only step: on VERL's 1.5B replay on one
H200 with a cold cache, old_log_prob took 13.6 s and update_actor 40.0 s without this warm-up
(docs/benchmarks.md). So each GPU worker runs, at set-up and outside every timed phase, the three
training phases' code on short rows and throws the results away.

Triton compiles a kernel once for each class of its integer arguments: 1, a multiple of 16, or
neither. A step's micro-batches meet every class of token count, in each of the actor's paths (rows
padded, alone or several together; rows packed end to end with ``use_remove_padding``), so the
warm-up's micro-batches do too (``warm_up_plan``). On 16 rows of VERL's 1.5B replay on one H200, a
warm-up of a lone row and a packed pair, one mini-batch each, left old_log_prob's first call 1.21 s
and update_actor's 5.09 s longer than a later call; this one leaves 0.53 and 2.33 s
(docs/benchmarks.md). What was left was mostly cuDNN's attention building an execution plan for each
new shape of padded rows (40-140 ms each), which every step of a run paid again, its lengths being
new. With packed rows (``use_remove_padding``) on a GPU, rows of 6,144 tokens or more now attend one
at a time at widths rounded up to 512 tokens, whose plans the worker builds at set-up for every width
(trainer/models/packed_attention.build_row_plans); shorter rows' padded shapes still pay theirs in
the phases.

For each of its three mini-batches (lone rows, equal pairs, packed pairs), two micro-batches each:
log-probs by the actor and by the ref (the code of old_log_prob and ref), then the actor's loss and
backward over the mini-batch, its gradients accumulated over the two micro-batches and synchronised
after the second, as update_actor does, and their norm, as the optimizer step takes it (the first
collective on a GPU tensor, which creates NCCL's communicator, when FSDP's own had none to run on one
GPU); then the gradients are dropped. No step of the actor's optimizer: the weights, its state and
its step count stay as they were; a throwaway optimizer of its kind steps once on a small tensor
(``throwaway_step``). The random number generators' states are restored. The rows' values do not
matter.
"""

from __future__ import annotations

import dataclasses
import inspect
import math

import torch

from trainer.batch import Batch
from trainer.config import ActorConfig
from trainer.workers.actor import (
    UpdateMetrics,
    UpdateSettings,
    compute_log_probs,
    mini_batch_gradients,
    reduce_and_clip_gradients,
)
from trainer.workers.distributed import DataParallel
from trainer.workers.fsdp import local_tensor

RESPONSE_BUDGET = 2048  # tokens of the warm-up's longest row (more after a long prompt: at least 32 response tokens)
ALIGN = 16  # Triton's divisibility class of an integer argument


def _longest(cap: int, residue: int) -> int | None:
    """The longest response of at most ``cap`` tokens that is ``residue`` modulo 16; None below 1."""
    r = cap - (cap - residue) % ALIGN
    return r if r >= 1 else None


def _other_class(offset: int) -> int:
    """A residue (mod 16) of response tokens whose total with ``offset`` prompt tokens is a multiple of
    16, where that total and the responses alone then fall in different classes; else 15 (neither
    is a multiple of 16). With residue 0 beside it, both classes of both counts are met."""
    return (-offset) % ALIGN or ALIGN - 1


def warm_up_plan(prompt_length: int, max_response_length: int, budget: int = RESPONSE_BUDGET) -> list[list[list[int]]]:
    """The warm-up's mini-batches, each a list of micro-batches of response lengths (after prompts of
    ``prompt_length``), each at most ``max_response_length``:

    - lone rows (padded, one a micro-batch): one whose response is a multiple of 16 tokens, one of
      the other class (``_other_class``: then one of them has a row total that is a multiple of 16
      and the other not);
    - equal pairs (padded, two rows a micro-batch, so the batch size is not 1), of those two lengths;
    - packed pairs: the longest row beside a row of 1-16 response tokens, so that packing pays
      (trainer.batch.packing_pays) unless the prompt is long beside the rows, their total tokens a
      multiple of 16 in one pair and not in the other.

    A class no length within the limits reaches is left out, and with it a micro-batch; with no
    length of either class for a lone row, the longest row is the lone row."""
    cap = min(max_response_length, max(budget - prompt_length, 32))
    lone = [r for r in (_longest(cap, 0), _longest(cap, _other_class(prompt_length))) if r is not None] or [cap]
    packed = []
    for residue in ((-2 * prompt_length) % ALIGN, 0 if (2 * prompt_length) % ALIGN else ALIGN - 1):
        short = (residue - cap) % ALIGN or ALIGN  # (cap + short) % 16 == residue, 1 <= short <= 16
        if short < cap:
            packed.append([cap, short])
    plan = [[[r] for r in lone], [[r, r] for r in lone], packed]
    return [mini for mini in plan if mini]


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


def warm_up_mini_batches(
    plan: list[list[list[int]]], prompt_length: int, vocab: int, generator: torch.Generator
) -> list[tuple[Batch, int]]:
    """warm_up_plan's mini-batches as rows (rows_of_lengths, micro-batches consecutive) and the size of
    their micro-batches (equal within a mini-batch)."""
    out = []
    for mini in plan:
        sizes = {len(micro) for micro in mini}
        if len(sizes) != 1:
            raise ValueError(f"warm-up mini-batch {mini}: its micro-batches differ in size")
        out.append((rows_of_lengths([r for micro in mini for r in micro], prompt_length, vocab, generator), sizes.pop()))
    return out


def throwaway_step(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """One step of a new optimizer of ``optimizer``'s class and settings on a small tensor of each dtype
    and device of its parameters; that optimizer is returned, ``optimizer`` is not touched.

    Why: CUDA loads a kernel's code at its first launch, and the first optimizer step launches
    kernels nothing before it has (AdamW's foreach updates). They are the same kernels for any
    tensor sizes, so the real optimizer's first step finds them loaded; its moments it still creates
    itself, as torch's optimizers do at their first step."""
    kinds = {(local.dtype, local.device)
             for group in optimizer.param_groups for local in map(local_tensor, group["params"])}
    params = [torch.zeros(8, dtype=dtype, device=device, requires_grad=True) for dtype, device in sorted(kinds, key=str)]
    for p in params:
        p.grad = torch.ones_like(p)
    accepted = inspect.signature(type(optimizer).__init__).parameters
    settings = {k: v for k, v in optimizer.defaults.items() if k in accepted}  # the constructor's own arguments
    twin = type(optimizer)(params, **settings)
    twin.step()
    return twin


def warm_up_training(
    actor: torch.nn.Module,
    ref: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer,
    mini_batches: list[tuple[Batch, int]],
    actor_cfg: ActorConfig,
    settings: UpdateSettings,
    dp: DataParallel,
) -> None:
    """old_log_prob's, ref's and update_actor's code on each (rows, micro-batch size) of
    ``mini_batches`` (warm_up_plan's, its micro-batches consecutive rows); nothing kept.

    Every worker of an FSDP group must call it with the same rows (its forwards are collectives)."""
    device = settings.device
    was_training = actor.training
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        try:
            for rows, size in mini_batches:
                old = compute_log_probs(actor, rows, settings.temperature, size, False, 0, dp, device)  # [B, R]
                ref_lp = compute_log_probs(ref, rows, settings.temperature, size, False, 0, dp, device) if ref is not None else old
                work = dataclasses.replace(rows, old_log_probs=old, ref_log_probs=ref_lp, advantages=torch.ones_like(old))
                cfg = dataclasses.replace(actor_cfg, ppo_micro_batch_size_per_gpu=size, use_dynamic_bsz=False)
                actor.train()
                mini_batch_gradients(actor, work, cfg, settings, dp, UpdateMetrics())
                reduce_and_clip_gradients(actor, math.inf, dp)  # the optimizer step's norm and its all-reduce
                optimizer.zero_grad(set_to_none=True)
            throwaway_step(optimizer)
        finally:
            optimizer.zero_grad(set_to_none=True)  # the update's gradients start from none, as before
            actor.train(was_training)
