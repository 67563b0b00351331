"""Clipped PPO/GRPO policy loss with dual clip, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.algorithms.aggregation import agg_loss
from trainer.algorithms.policy_loss import (
    POLICY_LOSSES,
    actor_loss,
    vanilla_policy_loss,
)

# One row of six tokens, eps = 0.2, c = 3. r = exp(logp - logp_old).
#   tok  r    A    L1=-A r  L2=-A clip(r,.8,1.2)  Lc=max   dual (A<0): min(Lc, -3A)   L     clipped?  lower?
#   0    1.5  +1   -1.5     -1.2                  -1.2     -                          -1.2  yes       no
#   1    0.5  +1   -0.5     -0.8                  -0.5     -                          -0.5  no        no
#   2    0.5  -1    0.5      0.8                   0.8     min(0.8, 3) = 0.8          0.8   yes       no
#   3    4    -1    4        1.2                   4       min(4, 3)   = 3            3     no        yes
#   4    4    +1   -4       -1.2                  -1.2     -                          -1.2  yes       no
#   5    1.5  +1   (masked out: must count nowhere)
RATIOS = torch.tensor([[1.5, 0.5, 0.5, 4.0, 4.0, 1.5]])
ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0, 1.0]])
MASK = torch.tensor([[1, 1, 1, 1, 1, 0]])
LOGP_OLD = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -1.5, -0.7]])


def logp_for(ratios: torch.Tensor, logp_old: torch.Tensor = LOGP_OLD) -> torch.Tensor:
    """logp with logp - logp_old = ln r, as a leaf that takes gradients."""
    return (logp_old + ratios.log()).requires_grad_(True)


def test_per_token_loss_by_hand() -> None:
    out = vanilla_policy_loss(logp_for(RATIOS), LOGP_OLD, ADV, MASK, eps_low=0.2, clip_ratio_c=3.0)
    assert torch.allclose(out.pg_losses[:, :5], torch.tensor([[-1.2, -0.5, 0.8, 3.0, -1.2]]), atol=1e-6)


def test_metrics_by_hand() -> None:
    out = vanilla_policy_loss(logp_for(RATIOS), LOGP_OLD, ADV, MASK)
    # clipped (L2 > L1): tokens 0, 2, 4 of the 5 in the mask
    assert out.pg_clipfrac.item() == pytest.approx(3 / 5)
    # dual clip: token 3 only
    assert out.pg_clipfrac_lower.item() == pytest.approx(1 / 5)
    # ppo_kl = mean(logp_old - logp) = -mean(log r) = -(ln 1.5 + 2 ln 0.5 + 2 ln 4)/5 = -ln(6)/5
    assert out.ppo_kl.item() == pytest.approx(-math.log(6) / 5, abs=1e-6)
    assert out.metrics() == pytest.approx(
        {"actor/pg_clipfrac": 0.6, "actor/ppo_kl": -math.log(6) / 5, "actor/pg_clipfrac_lower": 0.2}
    )


def test_gradient_is_zero_where_clipped() -> None:
    logp = logp_for(RATIOS)
    out = vanilla_policy_loss(logp, LOGP_OLD, ADV, MASK)
    out.pg_losses.sum().backward()
    # d(-A r)/d logp = -A r where the unclipped L1 is taken (token 1: -1 * 0.5);
    # tokens 0, 2, 4 are clipped (constant L2) and token 3 is dual-clipped (constant -A c): 0.
    # Token 5 is outside the mask but still a clipped token here (per-token loss is unmasked): 0.
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -0.5, 0.0, 0.0, 0.0, 0.0]]))


def test_dual_clip_inactive_for_positive_advantage() -> None:
    # r = 4, A = +1 would exceed -A c = -3 only for A < 0; with A > 0 the loss is the PPO clip -1.2
    old = LOGP_OLD[:, :1]
    out = vanilla_policy_loss(logp_for(torch.tensor([[4.0]]), old), old, torch.ones(1, 1), torch.ones(1, 1))
    assert out.pg_losses.item() == pytest.approx(-1.2)
    assert out.pg_clipfrac_lower.item() == 0.0


def test_dual_clip_bound_follows_c() -> None:
    old = LOGP_OLD[:, :1]
    logp = logp_for(torch.tensor([[4.0]]), old)
    out = vanilla_policy_loss(logp, old, -torch.ones(1, 1), torch.ones(1, 1), clip_ratio_c=10.0)
    # Lc = max(4, 1.2) = 4 < -A c = 10: dual clip inactive
    assert out.pg_losses.item() == pytest.approx(4.0)
    assert out.pg_clipfrac_lower.item() == 0.0


def test_asymmetric_clip() -> None:
    # eps_high = 0.28 (DAPO clip-higher): token 0's L2 = -1.28; eps_low still 0.2 for token 2: 0.8
    out = vanilla_policy_loss(logp_for(RATIOS), LOGP_OLD, ADV, MASK, eps_low=0.2, eps_high=0.28)
    assert out.pg_losses[0, 0].item() == pytest.approx(-1.28)
    assert out.pg_losses[0, 2].item() == pytest.approx(0.8)


def test_log_ratio_is_clamped_to_20() -> None:
    logp_old = torch.tensor([[-60.0, -0.1]])
    logp = torch.tensor([[-0.1, -60.0]])  # log ratio +59.9 and -59.9
    adv = torch.tensor([[-1.0, 1.0]])
    out = vanilla_policy_loss(logp, logp_old, adv, torch.ones(1, 2))
    assert torch.isfinite(out.pg_losses).all()
    # token 0: r = e^20, A = -1: L1 = e^20, dual clip -> 3; token 1: r = e^-20, A = +1: max(-e^-20, -0.8)
    assert out.pg_losses[0, 0].item() == pytest.approx(3.0)
    assert out.pg_losses[0, 1].item() == pytest.approx(-math.exp(-20))
    # ppo_kl uses the clamped log ratio: mean(-20, 20) = 0
    assert out.ppo_kl.item() == pytest.approx(0.0)


def test_ratio_one_gives_minus_advantage_and_no_clipping() -> None:
    adv = torch.tensor([[0.3, -0.7, 0.0]])
    logp = torch.tensor([[-1.0, -2.0, -3.0]])
    out = vanilla_policy_loss(logp, logp.clone(), adv, torch.ones(1, 3))
    assert torch.allclose(out.pg_losses, -adv)
    assert out.pg_clipfrac.item() == 0.0 and out.ppo_kl.item() == 0.0


def test_empty_mask_gives_finite_metrics() -> None:
    out = vanilla_policy_loss(logp_for(RATIOS), LOGP_OLD, ADV, torch.zeros_like(MASK))
    for v in (out.pg_clipfrac, out.ppo_kl, out.pg_clipfrac_lower):
        assert v.item() == 0.0
    assert agg_loss(out.pg_losses, torch.zeros_like(MASK), "token-mean").item() == 0.0


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="clip_ratio_c .* must be > 1; got 1.0"):
        vanilla_policy_loss(LOGP_OLD, LOGP_OLD, ADV, MASK, clip_ratio_c=1.0)
    with pytest.raises(ValueError, match="must share one shape"):
        vanilla_policy_loss(LOGP_OLD, LOGP_OLD[:, :3], ADV, MASK)


def test_registry() -> None:
    assert POLICY_LOSSES["vanilla"] is vanilla_policy_loss
    assert list(POLICY_LOSSES) == ["vanilla"]
    with pytest.raises(ValueError, match="unknown policy loss 'gspo'; valid names: vanilla"):
        POLICY_LOSSES["gspo"]


def test_actor_loss_combines_terms() -> None:
    pg = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
    ent = torch.tensor([[2.0, 2.0], [4.0, 100.0]])
    kl = torch.tensor([[0.1, 0.3], [0.5, 100.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    # token-mean over 3 tokens: pg (1+3+5)/3 = 3; H (2+2+4)/3 = 8/3; kl (0.1+0.3+0.5)/3 = 0.3
    # loss = 3 - 0.01 * 8/3 + 0.1 * 0.3
    loss = actor_loss(pg, mask, "token-mean", entropy=ent, entropy_coeff=0.01, kl=kl, kl_loss_coef=0.1)
    assert loss.item() == pytest.approx(3 - 0.01 * 8 / 3 + 0.03)
    assert actor_loss(pg, mask, "token-mean", entropy=ent).item() == pytest.approx(3.0)
