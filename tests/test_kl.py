"""KL estimators, the KL loss and the KL penalty in the reward, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.algorithms.kl import (
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_loss,
    kl_penalty,
    make_kl_controller,
)

# x = logp - logp_ref = 1, 0, -2
LOGP = torch.tensor([[0.0, -1.0, -2.0]])
REF = torch.tensor([[-1.0, -1.0, 0.0]])


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("kl", [1.0, 0.0, -2.0]),
        ("k1", [1.0, 0.0, -2.0]),
        ("abs", [1.0, 0.0, 2.0]),
        # x^2 / 2
        ("mse", [0.5, 0.0, 2.0]),
        ("k2", [0.5, 0.0, 2.0]),
        # y = -x = -1, 0, 2: e^y - y - 1 = e^-1 = 0.367879, 0, e^2 - 3 = 4.389056
        ("low_var_kl", [math.exp(-1), 0.0, math.exp(2) - 3]),
        ("k3", [math.exp(-1), 0.0, math.exp(2) - 3]),
    ],
)
def test_estimators_by_hand(kind: str, expected: list[float]) -> None:
    assert torch.allclose(kl_penalty(LOGP, REF, kind), torch.tensor([expected]), atol=1e-6)


def test_k3_clamps() -> None:
    x = torch.tensor([-30.0, 30.0, -3.0, 2.0])
    out = kl_penalty(x, torch.zeros_like(x), "low_var_kl")
    # x = -30: y = clamp(30) = 20, e^20 - 21 -> 10;  x = 30: y = -20, e^-20 + 19 -> 10
    # x = -3: y = 3, e^3 - 4 = 16.09 -> 10;           x = 2: y = -2, e^-2 + 1 = 1.135335 (inside)
    assert torch.allclose(out, torch.tensor([10.0, 10.0, 10.0, math.exp(-2) + 1]))
    assert (kl_penalty(x, torch.zeros_like(x), "k3") >= 0).all()


def test_straight_through_variant_keeps_value_takes_k2_gradient() -> None:
    logp = LOGP.clone().requires_grad_(True)
    out = kl_penalty(logp, REF, "low_var_kl+")
    assert torch.allclose(out, kl_penalty(LOGP, REF, "low_var_kl"))
    out.sum().backward()
    # d(x^2/2)/d logp = x = 1, 0, -2
    assert torch.allclose(logp.grad, torch.tensor([[1.0, 0.0, -2.0]]))


def test_registry_errors() -> None:
    plain = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
    assert KL_ESTIMATORS.names() == (*plain, *(f"{name}+" for name in plain))
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'; valid names: kl, k1, abs"):
        KL_ESTIMATORS["k4"]


@pytest.mark.parametrize("name", ["full", "full+"])
def test_full_kl_is_refused_with_its_reason_and_the_valid_names(name: str) -> None:
    # "full" passed validation and then failed in the first update: kl over the last dim of the
    # [B, T] token log-probs gave a [B] tensor ("loss_mat must be [B, T]; got shape (16,)").
    assert "full" not in KL_ESTIMATORS and "full-vocabulary" in KL_ESTIMATORS.refused()["full"]
    with pytest.raises(ValueError, match=r"'full\+?' is not supported: needs the full-vocabulary log-probs.*"
                       r"valid names: kl, k1, abs, mse, k2, low_var_kl, k3, kl\+"):
        kl_penalty(LOGP, REF, name)


def test_kl_loss_aggregates_under_the_mask() -> None:
    mask = torch.tensor([[1, 1, 0]])
    # k1 = 1, 0 (the -2 is masked out): token-mean 0.5
    assert kl_loss(LOGP, REF, mask, kind="kl").item() == pytest.approx(0.5)
    # seq-mean-token-sum: 1 + 0
    assert kl_loss(LOGP, REF, mask, kind="kl", loss_agg_mode="seq-mean-token-sum").item() == pytest.approx(
        1.0
    )


def test_kl_in_reward_by_hand() -> None:
    scores = torch.tensor([[0.0, 0.0, 1.0], [2.0, 0.0, 0.0]])
    logp_old = torch.tensor([[0.1, 0.2, 0.3], [0.4, 9.0, 9.0]])
    logp_ref = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    ctrl = FixedKLController(0.5)
    out = apply_kl_penalty(scores, logp_old, logp_ref, mask, ctrl, kind="kl")
    # kl (k1, masked) = [.1 .2 .3], [.4 0 0]; rewards = scores - 0.5 kl
    assert torch.allclose(out.token_level_rewards, torch.tensor([[-0.05, -0.1, 0.85], [1.8, 0.0, 0.0]]))
    assert torch.allclose(out.kl, torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.0, 0.0]]))
    # per-sequence masked means 0.2 and 0.4, mean 0.3
    assert out.current_kl == pytest.approx(0.3)
    assert out.beta == 0.5 and ctrl.value == 0.5
    assert out.metrics == pytest.approx(
        {"actor/reward_kl_penalty": 0.3, "actor/reward_kl_penalty_coeff": 0.5}
    )


def test_adaptive_controller_by_hand() -> None:
    ctrl = AdaptiveKLController(0.1, target_kl=0.1, horizon=100)
    # KL 0.5: error 0.5/0.1 - 1 = 4, clipped to 0.2; beta *= 1 + 0.2 * 10/100 = 1.02
    ctrl.update(0.5, n_steps=10)
    assert ctrl.value == pytest.approx(0.102)
    # KL 0.09: error -0.1; beta *= 1 - 0.1 * 10/100 = 0.99
    ctrl.update(0.09, n_steps=10)
    assert ctrl.value == pytest.approx(0.102 * 0.99)


def test_adaptive_controller_in_reward_updates_after_use() -> None:
    ctrl = make_kl_controller("adaptive", kl_coef=0.1, target_kl=0.1, horizon=100)
    scores = torch.zeros(2, 1)
    out = apply_kl_penalty(scores, torch.full((2, 1), 0.5), torch.zeros(2, 1), torch.ones(2, 1), ctrl)
    # this step used beta = 0.1; KL 0.5 > target: beta *= 1 + 0.2 * 2/100
    assert out.beta == 0.1
    assert torch.allclose(out.token_level_rewards, torch.full((2, 1), -0.05))
    assert ctrl.value == pytest.approx(0.1 * 1.004)


def test_controller_errors() -> None:
    assert KL_CONTROLLERS.names() == ("fixed", "adaptive")
    with pytest.raises(ValueError, match="unknown KL controller 'pid'; valid names: fixed, adaptive"):
        make_kl_controller("pid")
    with pytest.raises(ValueError, match="horizon must be positive; got 0"):
        AdaptiveKLController(0.1, 0.1, 0)
