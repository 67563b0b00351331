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

``KL_ESTIMATORS`` holds every valid name, the "+" variants included, and refuses VERL's "full" (the
exact KL over the vocabulary) with its reason; config validation reads it, and ``KL_CONTROLLERS``
for algorithm.kl_ctrl.type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from trainer.algorithms.aggregation import agg_loss, masked_mean
from trainer.registry import Registry

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


def straight_through(fn: KLFn) -> KLFn:
    """The value of ``fn`` with the gradient of k2: k2 - sg(k2) + sg(fn)."""

    def value_of_fn_gradient_of_k2(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
        k2 = kl_k2(logp, logp_ref)
        return k2 - k2.detach() + fn(logp, logp_ref).detach()

    return value_of_fn_gradient_of_k2


# Every valid name: the estimators, then each one's straight-through variant ("+"), as VERL lists them.
# An estimator added later registers its variant too: register(f"{name}+", straight_through(fn)).
KL_ESTIMATORS: Registry[KLFn] = Registry("KL estimator")
for _name, _fn in (
    ("kl", kl_k1),
    ("k1", kl_k1),
    ("abs", kl_abs),
    ("mse", kl_k2),
    ("k2", kl_k2),
    ("low_var_kl", kl_k3),
    ("k3", kl_k3),
):
    KL_ESTIMATORS.register(_name, _fn)
for _name in KL_ESTIMATORS.names():
    KL_ESTIMATORS.register(f"{_name}+", straight_through(KL_ESTIMATORS[_name]))
del _name, _fn
# VERL knows it; this trainer refuses it, with the reason (config validation reports it as unsupported).
_FULL_KL = "needs the full-vocabulary log-probs of actor and reference, which this trainer does not compute"
KL_ESTIMATORS.refuse("full", _FULL_KL)
KL_ESTIMATORS.refuse("full+", _FULL_KL)


def kl_penalty(logp: torch.Tensor, logp_ref: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL estimate of kind ``kind``: [B, T] token log-probs -> [B, T]."""
    return KL_ESTIMATORS[kind](logp, logp_ref)


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


# algorithm.kl_ctrl.type -> the controller made from (kl_coef, target_kl, horizon)
KL_CONTROLLERS: Registry[Callable[[float, float, int], KLController]] = Registry("KL controller")
KL_CONTROLLERS.register("fixed", lambda kl_coef, target_kl, horizon: FixedKLController(kl_coef))
KL_CONTROLLERS.register("adaptive", AdaptiveKLController)


def make_kl_controller(
    kind: str = "fixed", kl_coef: float = 0.001, target_kl: float = 0.1, horizon: int = 10000
) -> KLController:
    """A controller by name: "fixed" or "adaptive" (``KL_CONTROLLERS``)."""
    return KL_CONTROLLERS[kind](kl_coef, target_kl, horizon)


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
