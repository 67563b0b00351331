"""KL estimators chosen by name, the KL loss, and the KL penalty in the reward.

Per-token estimators of KL(pi || pi_ref) from the sampled token's log-probs, x = logp - logp_ref
(k1, k2, k3 of John Schulman's note "Approximating KL Divergence", 2020; names as VERL's
``kl_penalty`` in verl/trainer/ppo/core_algos.py):

    "kl", "k1":          x
    "abs":               |x|
    "mse", "k2":         x^2 / 2
    "low_var_kl", "k3":  y = clamp(-x, -20, 20);  k3 = exp(y) - y - 1, clamped to [-10, 10]

A name ending in "+" (e.g. "low_var_kl+") keeps that estimator's value but takes the gradient of k2,
which is unbiased for the KL's gradient (VERL's straight-through variant).

VERL's "full" (the exact KL over the vocabulary) is refused: see ``UNSUPPORTED_KL``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from trainer.algorithms.aggregation import agg_loss, masked_mean

KLFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def kl_k1(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """k1 = x = logp - logp_ref (unbiased, high variance, can be negative)."""
    return logp - logp_ref


def kl_abs(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """|x|."""
    return (logp - logp_ref).abs()


def kl_k2(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """k2 = x^2 / 2."""
    return 0.5 * (logp - logp_ref).square()


def kl_k3(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """k3 = exp(y) - y - 1 with y = clamp(logp_ref - logp, -20, 20); the result clamped to [-10, 10]."""
    y = torch.clamp(logp_ref - logp, -20.0, 20.0)
    k3 = torch.exp(y) - y - 1
    return torch.clamp(k3, -10.0, 10.0)


KL_ESTIMATORS: dict[str, KLFn] = {
    "kl": kl_k1,
    "k1": kl_k1,
    "abs": kl_abs,
    "mse": kl_k2,
    "k2": kl_k2,
    "low_var_kl": kl_k3,
    "k3": kl_k3,
}

# Names VERL knows that this trainer refuses, with the reason (config validation reads it).
UNSUPPORTED_KL: dict[str, str] = {
    "full": "needs the full-vocabulary log-probs of actor and reference, which this trainer does not compute",
}


def kl_estimator_names() -> tuple[str, ...]:
    """Every name ``get_kl_estimator`` accepts: the registry's, then each with the straight-through "+"."""
    return tuple(KL_ESTIMATORS) + tuple(f"{name}+" for name in KL_ESTIMATORS)


def get_kl_estimator(name: str) -> KLFn:
    """The estimator registered as ``name`` (a trailing "+" gives its straight-through k2 variant)."""
    base = name[:-1] if name.endswith("+") else name
    if base not in KL_ESTIMATORS:
        valid = ", ".join(kl_estimator_names())
        if base in UNSUPPORTED_KL:
            raise ValueError(f"KL estimator {name!r} is not supported: it {UNSUPPORTED_KL[base]}; valid names: {valid}")
        raise ValueError(f"unknown KL estimator {name!r}; valid names: {valid}")
    fn = KL_ESTIMATORS[base]
    if base == name:
        return fn

    def straight_through(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
        # Value of fn, gradient of k2: k2 - sg(k2) + sg(fn).
        k2 = kl_k2(logp, logp_ref)
        return k2 - k2.detach() + fn(logp, logp_ref).detach()

    return straight_through


def kl_penalty(logp: torch.Tensor, logp_ref: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL estimate of kind ``kind``: [B, T] token log-probs -> [B, T]."""
    return get_kl_estimator(kind)(logp, logp_ref)


def kl_loss(
    logp: torch.Tensor,
    logp_ref: torch.Tensor,
    response_mask: torch.Tensor,
    kind: str = "low_var_kl",
    loss_agg_mode: str = "token-mean",
) -> torch.Tensor:
    """agg(kl) over the response (VERL's use_kl_loss); the caller multiplies by kl_loss_coef."""
    return agg_loss(kl_penalty(logp, logp_ref, kind), response_mask, loss_agg_mode)


# ---------------------------------------------------------------------------------------------
# KL in the reward: r_t = score_t - beta kl_t, beta from a controller.
# ---------------------------------------------------------------------------------------------


@dataclass
class FixedKLController:
    """beta stays at its initial value."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        """No change: a fixed coefficient."""


@dataclass
class AdaptiveKLController:
    """beta <- beta (1 + clip(KL / target_kl - 1, -0.2, 0.2) n_steps / horizon) (Ziegler et al. 2019)."""

    value: float
    target_kl: float
    horizon: int

    def __post_init__(self) -> None:
        if self.horizon <= 0:
            raise ValueError(f"horizon must be positive; got {self.horizon}")
        if self.target_kl <= 0:
            raise ValueError(f"target_kl must be positive; got {self.target_kl}")

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move beta towards the value that keeps the KL at ``target_kl``."""
        proportional_error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon


KLController = FixedKLController | AdaptiveKLController


def make_kl_controller(
    kind: str = "fixed", kl_coef: float = 0.001, target_kl: float = 0.1, horizon: int = 10000
) -> KLController:
    """A controller by name: "fixed" or "adaptive"."""
    if kind == "fixed":
        return FixedKLController(kl_coef)
    if kind == "adaptive":
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"unknown KL controller {kind!r}; valid kinds: fixed, adaptive")


@dataclass
class KLRewardOutput:
    """token_level_rewards [B, T]; kl [B, T] (masked); the batch's mean KL; the beta used."""

    token_level_rewards: torch.Tensor
    kl: torch.Tensor
    current_kl: float
    beta: float
    metrics: dict[str, float] = field(default_factory=dict)


@torch.no_grad()
def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    logp_old: torch.Tensor,
    logp_ref: torch.Tensor,
    response_mask: torch.Tensor,
    controller: KLController,
    kind: str = "kl",
) -> KLRewardOutput:
    """token_level_rewards = token_level_scores - beta kl, kl masked to the response (use_kl_in_reward).

    current_kl = mean over sequences of the per-sequence masked-mean kl; the controller is then
    updated with it and n_steps = B (as VERL), so beta changes for the next step, not this one.
    """
    m = response_mask.to(token_level_scores.dtype)
    kl = kl_penalty(logp_old, logp_ref, kind) * m
    beta = controller.value
    rewards = token_level_scores - beta * kl
    current_kl = float(masked_mean(kl, m, dim=-1).mean())
    controller.update(current_kl, n_steps=token_level_scores.shape[0])
    metrics = {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
    return KLRewardOutput(rewards, kl, current_kl, beta, metrics)
