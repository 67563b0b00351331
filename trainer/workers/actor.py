"""What the actor and reference models compute: response log-probs, and the clipped policy update.

Plain torch on one worker's shard of the batch; the data-parallel group is reached only through the
``DataParallel`` object handed in, so one worker and many workers run the same code. The loss of a
mini-batch is weighted so that, summed over micro-batches and workers, it equals the loss of the
whole global mini-batch: 1 worker and N workers take the same optimizer step.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass

import torch

from trainer.algorithms.kl import kl_penalty
from trainer.algorithms.policy_loss import POLICY_LOSSES, PolicyLossOutput, actor_loss
from trainer.batch import Batch
from trainer.config import ActorConfig, clip_ratios
from trainer.workers.distributed import DataParallel
from trainer.workers.dynamic_batch import balanced_micro_batches
from trainer.workers.fsdp import (
    accumulate_gradients,
    clip_grad_norm,
    is_fsdp,
    keep_gathered,
)


# ----------------------------------------------------------------------------- micro-batching
def trim_padding(batch: Batch) -> Batch:
    """Drop prompt columns that are padding in every row (left) and response columns likewise (right)."""
    keep_p = batch.prompt_mask.any(dim=0).nonzero()
    p_start = int(keep_p[0]) if len(keep_p) else batch.prompt_ids.shape[1]
    keep_r = batch.response_mask.any(dim=0).nonzero()
    r_end = int(keep_r[-1]) + 1 if len(keep_r) else 0
    out = Batch(**{k: v for k, v in vars(batch).items()})
    for name, value in batch.tensors().items():
        if value.dim() == 2 and name.startswith("prompt"):
            setattr(out, name, value[:, p_start:])
        elif value.dim() == 2:
            setattr(out, name, value[:, :r_end])
    return out


def micro_batch_groups(
    batch: Batch,
    micro_batch_size: int,
    use_dynamic_bsz: bool,
    max_token_len: int,
    dp: DataParallel,
    lockstep: bool = False,
) -> list[list[int]]:
    """Row indices of each micro-batch: fixed size, or by token budget (VERL's use_dynamic_bsz).

    ``lockstep`` (FSDP over several workers, where every forward and backward is a collective):
    every worker gets the same number of groups, the group-wide maximum; a worker with fewer rows
    gets empty groups, which the caller runs as dummy micro-batches. Otherwise empty groups are dropped.
    """
    n = batch.size
    if use_dynamic_bsz:
        lengths = batch.sequence_lengths.tolist()
        groups = balanced_micro_batches(lengths, max_token_len, reduce_max=dp.reduce_max_int) if n else []
    else:
        groups = [list(range(i, min(i + micro_batch_size, n))) for i in range(0, n, micro_batch_size)]
    if not lockstep:
        return [g for g in groups if g]
    count = dp.reduce_max_int(len(groups))
    return groups + [[] for _ in range(count - len(groups))]


def dummy_micro_batch(batch: Batch, device: torch.device) -> Batch:
    """One short row to run where a worker has no rows left, so its collectives match the others'.

    Its results are thrown away (log-probs) or weighted by zero (the update)."""
    if batch.size:
        return trim_padding(batch.select([0])).to(device)
    one = torch.ones((1, 1), dtype=torch.long, device=device)
    zero = torch.zeros((1, 1), dtype=torch.float32, device=device)
    return Batch(
        prompt_ids=one, prompt_mask=one, response_ids=one, response_mask=one, uids=one[0],
        old_log_probs=zero, ref_log_probs=zero, advantages=zero,
    )


# ----------------------------------------------------------------------------- forward
def response_log_probs(
    model: torch.nn.Module, batch: Batch, temperature: float, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(response token) at the sampling temperature, [B, R] float32 (and entropy if asked).

    ``model`` is a trainer.workers.fsdp.PolicyModel: the LM head and log-softmax run in token chunks from the
    final hidden states, so the [B, R, V] logits are never built.
    """
    return model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        response_ids=batch.response_ids,
        temperature=temperature,
        with_entropy=with_entropy,
    )


def needs_lockstep(model: torch.nn.Module, dp: DataParallel) -> bool:
    """FSDP over several workers: every worker must run the same number of forward passes."""
    return dp.active and is_fsdp(model)


@torch.no_grad()
def compute_log_probs(
    model: torch.nn.Module,
    batch: Batch,
    temperature: float,
    micro_batch_size: int,
    use_dynamic_bsz: bool,
    max_token_len: int,
    dp: DataParallel,
    device: torch.device,
) -> torch.Tensor:
    """Log-probs of every response token of the shard, [B, R] float32 on the CPU, in row order."""
    was_training = model.training
    model.eval()
    out = torch.zeros(batch.response_ids.shape, dtype=torch.float32)
    lockstep = needs_lockstep(model, dp)
    # Each micro-batch's log-probs stay on the device until the last is queued: one wait on the GPU
    # for the whole call, not one per micro-batch (the GPU idled while the host caught up after each).
    pieces: list[tuple[list[int], torch.Tensor]] = []
    try:
        with keep_gathered(model):  # one all-gather of the weights for all micro-batches
            for rows in micro_batch_groups(batch, micro_batch_size, use_dynamic_bsz, max_token_len, dp, lockstep):
                if not rows:
                    response_log_probs(model, dummy_micro_batch(batch, device), temperature)
                    continue
                micro = trim_padding(batch.select(rows)).to_device(device)
                logp, _ = response_log_probs(model, micro, temperature)
                pieces.append((rows, logp.float()))  # [rows, R'] on the device
    finally:
        model.train(was_training)
    for rows, logp in pieces:
        out[torch.as_tensor(rows), : logp.shape[1]] = logp.cpu()
    return out


# ----------------------------------------------------------------------------- loss weights
def loss_normaliser(mode: str, mask: torch.Tensor) -> float:
    """What ``agg_loss`` divides by in ``mode``: response tokens for token-mean, sequences with at
    least one response token for every seq-mean-* mode (seq-mean-token-sum-norm's constant length
    divides inside the loss, the same on every micro-batch).

    A micro-batch's loss times normaliser(micro) / (the normaliser summed over the global mini-batch),
    summed over micro-batches and workers, is the loss of the whole global mini-batch.
    """
    if mode == "token-mean":
        return float(mask.sum())
    return float((mask.sum(dim=1) > 0).sum())


# ----------------------------------------------------------------------------- update
@dataclass
class UpdateSettings:
    temperature: float
    max_response_length: int
    n_mini_batches: int
    device: torch.device


@dataclass
class MicroBatchLoss:
    """One micro-batch's actor loss (in cfg.loss_agg_mode, not yet weighted) and what its metrics need."""

    loss: torch.Tensor
    pg: PolicyLossOutput
    kl: torch.Tensor | None
    entropy: torch.Tensor | None
    mask: torch.Tensor

    def token_sums(self, tokens: float) -> dict[str, torch.Tensor]:
        """Each token metric summed over the response tokens (the policy-loss ones are token means)."""
        parts = {f"actor/{f.name}": getattr(self.pg, f.name).detach() * tokens
                 for f in dataclasses.fields(self.pg) if f.name != "pg_losses"}
        if self.kl is not None:
            parts["actor/kl_loss"] = (self.kl.detach() * self.mask).sum()
        if self.entropy is not None:
            parts["actor/entropy"] = (self.entropy.detach() * self.mask).sum()
        return parts


def micro_batch_loss(model: torch.nn.Module, micro: Batch, cfg: ActorConfig, settings: UpdateSettings) -> MicroBatchLoss:
    """Clipped policy loss, minus the entropy bonus, plus the KL loss, of one micro-batch on the device."""
    eps_low, eps_high = clip_ratios(cfg)
    use_kl = cfg.use_kl_loss
    mask = micro.response_mask.float()
    logp, entropy = response_log_probs(model, micro, settings.temperature, cfg.entropy_coeff != 0.0)
    policy_loss = POLICY_LOSSES[cfg.policy_loss.loss_mode]  # the registry's, as the config validated
    pg = policy_loss(logp, micro.old_log_probs, micro.advantages, mask, eps_low, eps_high, cfg.clip_ratio_c)
    kl = kl_penalty(logp, micro.ref_log_probs, cfg.kl_loss_type) if use_kl else None
    loss = actor_loss(
        pg.pg_losses,
        mask,
        cfg.loss_agg_mode,
        entropy=entropy,
        entropy_coeff=cfg.entropy_coeff,
        kl=kl,
        kl_loss_coef=cfg.kl_loss_coef if use_kl else 0.0,
        max_response_length=settings.max_response_length,
    )
    return MicroBatchLoss(loss, pg, kl, entropy, mask)


class UpdateMetrics:
    """Metric sums over an update: on the device through a mini-batch (one host read per optimizer
    step), then token-weighted means over all workers (loss and grad norm are already global)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.device_sums: dict[str, torch.Tensor] = {}

    def add_micro_batch(self, weighted_loss: torch.Tensor, token_sums: dict[str, torch.Tensor], tokens: int) -> None:
        for key, value in {"actor/pg_loss": weighted_loss, **token_sums}.items():
            self.device_sums[key] = self.device_sums[key] + value.float() if key in self.device_sums else value.float()
        for key in token_sums:
            self.counts[key] += tokens

    def end_mini_batch(self, grad_norm: float, stepped: bool, dp: DataParallel) -> None:
        if not stepped:
            self.sums["actor/skipped_steps"] += 1.0
        keys = list(self.device_sums)
        values = torch.stack([self.device_sums[k] for k in keys]).tolist() if keys else []
        self.device_sums = {}
        mini_sums = dict(zip(keys, values, strict=True))
        self.sums["actor/pg_loss"] += dp.all_reduce_sum(mini_sums.pop("actor/pg_loss", 0.0))
        self.counts["actor/pg_loss"] += 1
        for key, value in mini_sums.items():
            self.sums[key] += value
        self.sums["actor/grad_norm"] += grad_norm
        self.counts["actor/grad_norm"] += 1

    def finish(self, dp: DataParallel) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, total in self.sums.items():
            if key in ("actor/pg_loss", "actor/grad_norm"):
                out[key] = total / max(self.counts[key], 1)
            elif key == "actor/skipped_steps":
                out[key] = total
            else:
                out[key] = dp.all_reduce_sum(total) / max(dp.all_reduce_sum(float(self.counts[key])), 1.0)
        return out


def backward_micro_batch(
    model: torch.nn.Module,
    mini: Batch,
    rows: list[int],
    cfg: ActorConfig,
    settings: UpdateSettings,
    global_norm: float,
    metrics: UpdateMetrics,
) -> None:
    """Backward of one micro-batch's share of the global mini-batch's loss."""
    if not rows:  # this worker is out of rows: a zero-weighted pass keeps FSDP's collectives in step
        logp, _ = response_log_probs(model, dummy_micro_batch(mini, settings.device), settings.temperature)
        (logp.sum() * 0.0).backward()
        return
    cpu_micro = trim_padding(mini.select(rows))
    out = micro_batch_loss(model, cpu_micro.to_device(settings.device), cfg, settings)
    # The weight and token count come from the host copy of the mask: no device sync here.
    cpu_mask = cpu_micro.response_mask.float()
    weight = loss_normaliser(cfg.loss_agg_mode, cpu_mask) / max(global_norm, 1.0)
    (out.loss * weight).backward()
    tokens = float(cpu_mask.sum())
    metrics.add_micro_batch(out.loss.detach() * weight, out.token_sums(tokens), int(tokens))


def reduce_and_clip_gradients(model: torch.nn.Module, max_norm: float, dp: DataParallel) -> float:
    """The gradients summed over the workers and clipped to ``max_norm``; their norm before the clip."""
    if not is_fsdp(model):  # FSDP reduce-scatters in the backward pass itself
        dp.all_reduce_grads(model)
    return clip_grad_norm([p for p in model.parameters() if p.requires_grad], max_norm)


def optimizer_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: ActorConfig, dp: DataParallel
) -> tuple[float, bool]:
    """Reduce the gradients, clip them, step: (grad norm, whether the step was taken)."""
    grad_norm = reduce_and_clip_gradients(model, cfg.grad_clip, dp)
    stepped = math.isfinite(grad_norm)  # a non-finite gradient would poison the weights: skip it
    if stepped:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, stepped


def update_mini_batch(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    mini: Batch,
    cfg: ActorConfig,
    settings: UpdateSettings,
    dp: DataParallel,
    metrics: UpdateMetrics,
) -> None:
    """One optimizer step on this worker's slice of a global mini-batch."""
    optimizer.zero_grad(set_to_none=True)
    mini_batch_gradients(model, mini, cfg, settings, dp, metrics)
    grad_norm, stepped = optimizer_step(model, optimizer, cfg, dp)
    metrics.end_mini_batch(grad_norm, stepped, dp)


def mini_batch_gradients(
    model: torch.nn.Module, mini: Batch, cfg: ActorConfig, settings: UpdateSettings, dp: DataParallel,
    metrics: UpdateMetrics,
) -> None:
    """The gradients of the global mini-batch's loss from this worker's slice, micro-batch by micro-batch."""
    global_norm = dp.all_reduce_sum(loss_normaliser(cfg.loss_agg_mode, mini.response_mask))
    groups = micro_batch_groups(
        mini, cfg.ppo_micro_batch_size_per_gpu, cfg.use_dynamic_bsz, cfg.ppo_max_token_len_per_gpu, dp,
        needs_lockstep(model, dp),
    )
    with keep_gathered(model):  # FSDP: one all-gather and one reduce-scatter per mini-batch
        for index, rows in enumerate(groups):
            # FSDP: gradients reduce-scatter once, after the last micro-batch (every worker has the
            # same number of groups under lockstep, so they agree on which one is last).
            accumulate_gradients(model, last_micro_batch=index == len(groups) - 1)
            backward_micro_batch(model, mini, rows, cfg, settings, global_norm, metrics)


def update_policy(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    shard: Batch,
    cfg: ActorConfig,
    settings: UpdateSettings,
    dp: DataParallel,
) -> dict[str, float]:
    """ppo_epochs passes over the shard's mini-batches; one optimizer step per mini-batch.

    The shard holds this worker's slice of every global mini-batch, in mini-batch order (the driver
    lays it out so), so mini-batch k here and on every other worker together form global mini-batch k.
    """
    assert shard.advantages is not None and shard.old_log_probs is not None
    if cfg.use_kl_loss and shard.ref_log_probs is None:
        raise ValueError("use_kl_loss needs ref log-probs in the batch (the ref phase did not run)")
    rows_per_mini = shard.size // settings.n_mini_batches
    metrics = UpdateMetrics()
    model.train()
    for _epoch in range(cfg.ppo_epochs):
        for k in range(settings.n_mini_batches):
            mini = shard.select(list(range(k * rows_per_mini, (k + 1) * rows_per_mini)))
            update_mini_batch(model, optimizer, mini, cfg, settings, dp, metrics)
    return metrics.finish(dp)
