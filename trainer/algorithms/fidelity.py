"""Rollout fidelity: how far the rollout engine's token log-probs are from the trainer's.

Over response tokens, with x = old - rollout (the trainer's old_log_prob minus the engine's
rollout_log_prob of the same token):

    rollout_fidelity/token_mult_prob_error  mean exp(|x|)             NeMo-RL's token_mult_prob_error
                                                                      (nemo_rl/algorithms/loss_functions.py)
    rollout_fidelity/probs_diff_{max,mean,std}  of |exp(old) - exp(rollout)|   VERL's rollout_probs_diff_*
    rollout_fidelity/pearson                of exp(old) and exp(rollout)       VERL's
                                                      rollout_actor_probs_pearson_corr (verl/utils/debug/metrics.py)
    rollout_fidelity/mismatch_kl            mean(exp(x) - x - 1)      prime-rl's mismatch_kl
                                                                      (prime_rl/trainer/rl/loss.py)

mismatch_kl takes x = old - rollout, as prime-rl does (its log importance ratio, trainer minus
inference): the tokens were drawn by the rollout engine, so E[exp(x)] = 1 and the mean is the k3
estimate (Schulman, "Approximating KL divergence", 2020) of KL(rollout || trainer), >= 0 per token.

The figures are built from sums (``FidelitySums``) so that shards merge exactly: counts and sums
add, maxima take the max, and the Pearson correlation comes from the pooled sums of x, y, x^2, y^2
and xy, never from a mean of per-worker figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

PREFIX = "rollout_fidelity"
METRIC_NAMES: tuple[str, ...] = tuple(
    f"{PREFIX}/{name}"
    for name in ("token_mult_prob_error", "probs_diff_max", "probs_diff_mean", "probs_diff_std", "pearson", "mismatch_kl")
)


@dataclass(frozen=True)
class FidelitySums:
    """Sufficient statistics of one shard's response tokens (float64 host numbers)."""

    count: float = 0.0
    exp_abs_sum: float = 0.0  # sum exp(|x|)
    k3_sum: float = 0.0  # sum exp(x) - x - 1
    diff_sum: float = 0.0  # sum |p_old - p_rollout|
    diff_sq_sum: float = 0.0
    diff_max: float = 0.0
    old_sum: float = 0.0  # sums of the probabilities p_old, p_rollout, their squares and product
    rollout_sum: float = 0.0
    old_sq_sum: float = 0.0
    rollout_sq_sum: float = 0.0
    cross_sum: float = 0.0


def fidelity_sums(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> FidelitySums:
    """The sums over the tokens where ``mask`` is 1; old, rollout and mask are [B, R]."""
    if old.shape != rollout.shape or old.shape != mask.shape:
        raise ValueError(
            f"old, rollout and mask must have one shape; got {tuple(old.shape)}, {tuple(rollout.shape)}, "
            f"{tuple(mask.shape)}"
        )
    keep = mask.bool()
    old_lp = old.double()[keep]  # [N] response tokens only
    rollout_lp = rollout.double().to(old_lp.device)[keep.to(old_lp.device)]  # [N]
    x = old_lp - rollout_lp  # [N]
    p_old, p_rollout = old_lp.exp(), rollout_lp.exp()  # [N] each
    diff = (p_old - p_rollout).abs()  # [N]
    return FidelitySums(
        count=float(x.numel()),
        exp_abs_sum=float(x.abs().exp().sum()),
        k3_sum=float((x.exp() - x - 1).sum()),
        diff_sum=float(diff.sum()),
        diff_sq_sum=float(diff.square().sum()),
        diff_max=float(diff.max()) if x.numel() else 0.0,
        old_sum=float(p_old.sum()),
        rollout_sum=float(p_rollout.sum()),
        old_sq_sum=float(p_old.square().sum()),
        rollout_sq_sum=float(p_rollout.square().sum()),
        cross_sum=float((p_old * p_rollout).sum()),
    )


def merge_sums(parts: Sequence[FidelitySums]) -> FidelitySums:
    """One shard's sums from several: everything adds except the maximum."""
    total = {f.name: math.fsum(getattr(p, f.name) for p in parts) for f in fields(FidelitySums)}
    total["diff_max"] = max((p.diff_max for p in parts), default=0.0)
    return FidelitySums(**total)


def _pearson(s: FidelitySums) -> float:
    """Pearson correlation of p_old and p_rollout from the pooled sums; NaN when either is constant."""
    n = s.count
    cov = s.cross_sum - s.old_sum * s.rollout_sum / n
    var_old = s.old_sq_sum - s.old_sum**2 / n
    var_rollout = s.rollout_sq_sum - s.rollout_sum**2 / n
    if var_old <= 0 or var_rollout <= 0:
        return math.nan
    return max(-1.0, min(1.0, cov / math.sqrt(var_old * var_rollout)))


def fidelity_metrics(sums: FidelitySums) -> dict[str, float]:
    """The rollout_fidelity/* figures (module docstring); empty without tokens, pearson left out when
    undefined (every probability equal, as greedy decoding of a peaked model can give)."""
    n = sums.count
    if n == 0:
        return {}
    mean_diff = sums.diff_sum / n
    # the sample (n - 1) standard deviation, as VERL's torch.std
    var_diff = max(0.0, sums.diff_sq_sum - n * mean_diff**2) / (n - 1) if n > 1 else 0.0
    out = {
        f"{PREFIX}/token_mult_prob_error": sums.exp_abs_sum / n,
        f"{PREFIX}/probs_diff_max": sums.diff_max,
        f"{PREFIX}/probs_diff_mean": mean_diff,
        f"{PREFIX}/probs_diff_std": math.sqrt(var_diff),
        f"{PREFIX}/pearson": _pearson(sums),
        f"{PREFIX}/mismatch_kl": sums.k3_sum / n,
    }
    return {k: v for k, v in out.items() if not math.isnan(v)}


def rollout_fidelity(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The rollout_fidelity/* figures of one batch ([B, R] each), all of its response tokens pooled."""
    return fidelity_metrics(fidelity_sums(old, rollout, mask))
