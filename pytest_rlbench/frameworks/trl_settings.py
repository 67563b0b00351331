"""The session's trainer config as TRL ``GRPOConfig`` keywords, and what cannot be made equal.

Pure: plain numbers and strings, no TRL or torch import, so every mapping is testable without TRL.
The keys are TRL 1.16's (``trl/trainer/grpo_config.py``); docs/trl.md tables them against VERL's.

The batch: one of our steps trains on ``train_batch_size x n`` responses in mini-batches of
``ppo_mini_batch_size x n`` (one optimizer step each), every mini-batch in micro-batches of
``ppo_micro_batch_size_per_gpu``. TRL generates once per ``steps_per_generation`` micro-batches of
``per_device_train_batch_size`` and steps the optimizer every ``gradient_accumulation_steps``, so
the same work is: micro-batch = ours, accumulation = micro-batches per mini-batch, generation =
micro-batches per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.config import Config

# VERL's loss_agg_mode -> TRL's loss_type with the same normalisation (trl GRPOConfig.loss_type):
# token-mean over the mini-batch's tokens is DAPO's global token normalisation; seq-mean-token-mean
# is TRL's "grpo"; Dr. GRPO divides by a constant, the maximum completion length.
LOSS_TYPES = {"token-mean": "dapo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum-norm": "dr_grpo"}
# TRL's KL term is always k3 (Schulman's estimator), VERL's low_var_kl before its clamp.
K3_NAMES = ("low_var_kl", "k3")


@dataclass
class TRLPlan:
    """GRPOConfig keywords, the micro-batch loop one of our steps becomes, and the differences."""

    args: dict[str, Any]
    micro_batch: int  # responses per TRL training_step call
    grad_accum: int  # training_step calls per optimizer step
    micro_steps: int  # training_step calls per step (one generation)
    differences: list[str] = field(default_factory=list)

    @property
    def computes_old_log_prob(self) -> bool:
        """TRL computes old log-probs only when one generation feeds several optimizer steps (its
        ``_generate_and_score_completions``: gradient_accumulation_steps % generate_every != 0)."""
        return self.grad_accum % (self.micro_steps * self.args["num_iterations"]) != 0


def batch_plan(rows: int, mini_rows: int, micro: int) -> tuple[int, int, int]:
    """(micro-batch, accumulation steps, micro-steps per step) for ``rows`` responses a step in
    optimizer steps of ``mini_rows``; the micro-batch is ours when it divides the mini-batch."""
    if rows % mini_rows:
        raise ValueError(f"a step's {rows} responses do not split into mini-batches of {mini_rows}")
    size = micro if mini_rows % micro == 0 else math.gcd(mini_rows, micro)
    return size, mini_rows // size, rows // size


def trl_plan(cfg: Config, output_dir: str, model_dtype: str) -> TRLPlan:
    """The config as TRL settings; ``model_dtype`` is the resolved weight dtype ("float32", ...)."""
    arr = cfg.actor_rollout_ref
    actor, rollout, optim = arr.actor, arr.rollout, arr.actor.optim
    n = rollout.n
    rows, mini_rows = cfg.data.train_batch_size * n, actor.ppo_mini_batch_size * n
    micro, accum, micro_steps = batch_plan(rows, mini_rows, actor.ppo_micro_batch_size_per_gpu)
    on_gpu = cfg.trainer.device == "cuda"
    low, high = actor.clip_ratio_low or actor.clip_ratio, actor.clip_ratio_high or actor.clip_ratio
    args: dict[str, Any] = {
        "output_dir": output_dir,
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": accum,
        "steps_per_generation": micro_steps,
        "num_generations": n,
        "num_iterations": actor.ppo_epochs,
        "max_completion_length": cfg.data.max_response_length,
        "temperature": rollout.temperature,
        "top_p": rollout.top_p,
        "top_k": max(rollout.top_k, 0),  # ours: -1 or 0 off; TRL: 0 off
        "beta": actor.kl_loss_coef if actor.use_kl_loss else 0.0,
        "epsilon": low,
        "epsilon_high": high,
        "loss_type": LOSS_TYPES.get(actor.loss_agg_mode, "dapo"),
        "scale_rewards": "group" if cfg.algorithm.norm_adv_by_std_in_grpo else "none",
        "learning_rate": optim.lr,
        "weight_decay": optim.weight_decay,
        "adam_beta1": optim.betas[0],
        "adam_beta2": optim.betas[1],
        "lr_scheduler_type": "constant_with_warmup",
        "warmup_steps": optim.lr_warmup_steps,
        "max_grad_norm": actor.grad_clip,
        "gradient_checkpointing": arr.model.enable_gradient_checkpointing,
        "model_init_kwargs": {"dtype": model_dtype},
        "bf16": on_gpu and model_dtype == "float32",  # ours computes in bf16 on GPU (FSDP mixed precision)
        "use_cpu": not on_gpu,
        "seed": cfg.trainer.seed,
        "report_to": "none",
        "save_strategy": "no",
        "logging_steps": 1_000_000,  # the adapter never calls TRL's log; keep its loop quiet regardless
        "log_completions": False,
    }
    if rollout.ignore_eos:
        # HF generate's MinNewTokensLogitsProcessor masks EOS until the limit: every response full length.
        args["generation_kwargs"] = {"min_new_tokens": cfg.data.max_response_length}
    return TRLPlan(args, micro, accum, micro_steps, differences(cfg, micro))


def differences(cfg: Config, micro: int) -> list[str]:
    """The settings TRL's GRPOTrainer cannot be given as ours has them, one line each."""
    arr = cfg.actor_rollout_ref
    actor, rollout = arr.actor, arr.rollout
    out = [
        f"generation: trl samples with transformers' generate in the training process; ours with the "
        f"'{rollout.name}' engine in the Ray workers",
        "trl runs in the driver process (one accelerate process, no Ray actor)",
        f"dual-clip (clip_ratio_c={actor.clip_ratio_c:g}) has no trl counterpart",
    ]
    if micro != actor.ppo_micro_batch_size_per_gpu:
        out.append(f"micro-batch: trl {micro} responses (dividing the mini-batch), ours "
                   f"{actor.ppo_micro_batch_size_per_gpu}")
    if actor.loss_agg_mode not in LOSS_TYPES:
        out.append(f"loss_agg_mode {actor.loss_agg_mode}: trl has no such loss_type (dapo used)")
    if actor.use_kl_loss and actor.kl_loss_type not in K3_NAMES:
        out.append(f"kl_loss_type {actor.kl_loss_type}: trl's KL term is k3 (low_var_kl)")
    if cfg.algorithm.use_kl_in_reward:
        out.append("use_kl_in_reward: trl has no KL penalty in the reward (its beta is a KL loss)")
    if cfg.algorithm.adv_estimator != "grpo":
        out.append(f"adv_estimator {cfg.algorithm.adv_estimator}: trl computes GRPO advantages only")
    if actor.entropy_coeff:
        out.append(f"entropy_coeff {actor.entropy_coeff:g}: trl's GRPO loss has no entropy bonus")
    if actor.policy_loss.loss_mode != "vanilla":
        out.append(f"policy loss {actor.policy_loss.loss_mode}: trl's GRPO loss is the vanilla clipped one")
    if actor.use_dynamic_bsz:
        out.append("use_dynamic_bsz: trl's micro-batches have a fixed number of responses")
    if rollout.target_lengths.distribution != "none":
        out.append("replayed response-length targets: trl cannot draw per-row lengths (natural lengths)")
    if arr.model.enable_gradient_checkpointing and arr.model.gradient_checkpointing_policy != "full":
        out.append(f"gradient_checkpointing_policy {arr.model.gradient_checkpointing_policy}: trl recomputes "
                   "each checkpointed layer in full")
    if arr.model.enable_gradient_checkpointing and arr.model.gradient_checkpointing_layers:
        out.append(f"gradient_checkpointing_layers {arr.model.gradient_checkpointing_layers}: trl checkpoints "
                   "every layer")
    offload = actor.fsdp_config
    if offload.param_offload or offload.optimizer_offload:
        out.append("parameter/optimizer offload: not applied to trl")
    return out
