"""The clipped PPO/GRPO policy loss per token, with dual clip.

PPO's clipped surrogate (Schulman et al. 2017, "Proximal Policy Optimization Algorithms"), as used
per token by GRPO (Shao et al. 2024, "DeepSeekMath"), with the dual clip of Ye et al. 2020
("Mastering Complex Control in MOBA Games with Deep Reinforcement Learning") for negative
advantages; VERL's ``compute_policy_loss_vanilla`` (verl/trainer/ppo/core_algos.py).

    r   = exp(clamp(logp - logp_old, -20, 20))
    L1  = -A r
    L2  = -A clip(r, 1 - eps_low, 1 + eps_high)
    Lc  = max(L1, L2)
    L   = min(Lc, -A c)   where A < 0 (dual clip, c = clip_ratio_c > 1),   L = Lc elsewhere

The loss stays per token [B, T]; ``aggregation.agg_loss`` makes it a scalar, and
``actor_loss`` adds the entropy bonus and the KL loss in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from trainer.algorithms.aggregation import agg_loss, masked_mean
from trainer.registry import Registry


@dataclass
class PolicyLossOutput:
    """Per-token loss and the step's metrics (scalars, detached).

    pg_losses: L [B, T] (not yet masked or aggregated).
    pg_clipfrac: masked mean of [L2 > L1], the share of tokens whose ratio was clipped.
    ppo_kl: masked mean of (logp_old - logp), the approximate KL(old || new) (clamped log-ratio).
    pg_clipfrac_lower: masked mean of [A < 0 and Lc > -A c], the share cut by the dual clip.
    """

    pg_losses: torch.Tensor
    pg_clipfrac: torch.Tensor
    ppo_kl: torch.Tensor
    pg_clipfrac_lower: torch.Tensor

    def metrics(self) -> dict[str, float]:
        """VERL's metric names, as floats."""
        return {
            "actor/pg_clipfrac": float(self.pg_clipfrac),
            "actor/ppo_kl": float(self.ppo_kl),
            "actor/pg_clipfrac_lower": float(self.pg_clipfrac_lower),
        }


def vanilla_policy_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float | None = None,
    clip_ratio_c: float = 3.0,
) -> PolicyLossOutput:
    """Clipped surrogate with dual clip, per token. ``eps_high`` defaults to ``eps_low``.

    logp, logp_old, advantages, response_mask: [B, T]. Gradients flow through ``logp`` only.
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip bound c) must be > 1; got {clip_ratio_c}")
    if not (logp.shape == logp_old.shape == advantages.shape == response_mask.shape):
        raise ValueError(
            "logp, logp_old, advantages and response_mask must share one shape; got "
            f"{tuple(logp.shape)}, {tuple(logp_old.shape)}, {tuple(advantages.shape)}, "
            f"{tuple(response_mask.shape)}"
        )
    if eps_high is None:
        eps_high = eps_low
    A, c = advantages, clip_ratio_c

    log_ratio = torch.clamp(logp - logp_old, -20.0, 20.0)  # exp(20) still fits float32 comfortably
    r = torch.exp(log_ratio)
    L1 = -A * r
    L2 = -A * torch.clamp(r, 1.0 - eps_low, 1.0 + eps_high)
    Lc = torch.maximum(L1, L2)
    L3 = -A * c
    L = torch.where(A < 0, torch.minimum(Lc, L3), Lc)

    with torch.no_grad():
        clipfrac = masked_mean((L2 > L1).to(r.dtype), response_mask)
        ppo_kl = masked_mean(-log_ratio, response_mask)
        clipfrac_lower = masked_mean(((Lc > L3) & (A < 0)).to(r.dtype), response_mask)
    return PolicyLossOutput(L, clipfrac, ppo_kl, clipfrac_lower)


PolicyLossFn = Callable[..., PolicyLossOutput]
# actor_rollout_ref.actor.policy_loss.loss_mode -> the per-token loss (config validation reads the names)
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")
POLICY_LOSSES.register("vanilla", vanilla_policy_loss)


def actor_loss(
    pg_losses: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    entropy: torch.Tensor | None = None,
    entropy_coeff: float = 0.0,
    kl: torch.Tensor | None = None,
    kl_loss_coef: float = 0.0,
    max_response_length: int | None = None,
) -> torch.Tensor:
    """The actor's scalar loss: agg(L) - entropy_coeff agg(H) + kl_loss_coef agg(kl).

    entropy H and kl are per-token [B, T] (see entropy.py and kl.py); a term is skipped when its
    tensor is None or its coefficient is 0.
    """

    def agg(x: torch.Tensor) -> torch.Tensor:
        return agg_loss(x, response_mask, loss_agg_mode, max_response_length)

    loss = agg(pg_losses)
    if entropy is not None and entropy_coeff != 0.0:
        loss = loss - entropy_coeff * agg(entropy)
    if kl is not None and kl_loss_coef != 0.0:
        loss = loss + kl_loss_coef * agg(kl)
    return loss
