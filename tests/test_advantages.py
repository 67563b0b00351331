"""Advantage estimators against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.algorithms.advantages import (
    ADV_ESTIMATORS,
    AdvantageInput,
    compute_advantage,
)

# Six responses over T = 4 tokens. Scores s_i = sum of the row's token rewards; groups by uid.
#   i  uid  s_i  response length
#   0  a    1    3     (reward split 0.25 + 0.75 over two tokens: s is the sum)
#   1  a    0    2
#   2  a    1    4
#   3  b    0.5  1     (a group of one)
#   4  c    2    2     (all-equal group)
#   5  c    2    3
REWARDS = torch.tensor(
    [
        [0.0, 0.25, 0.75, 0.0],
        [0.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 1.0],
        [0.5, 0.0, 0.0, 0.0],
        [0.0, 2.0, 0.0, 0.0],
        [0.0, 0.0, 2.0, 0.0],
    ]
)
MASK = torch.tensor(
    [
        [1, 1, 1, 0],
        [1, 1, 0, 0],
        [1, 1, 1, 1],
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 1, 1, 0],
    ]
)
UIDS = ["a", "a", "a", "b", "c", "c"]


def per_row(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The advantage of each row, after checking that it is constant over the row's mask and 0 off it."""
    m = mask.bool()
    assert (adv[~m] == 0).all()
    first = adv[:, 0:1]
    assert torch.allclose(torch.where(m, adv, first), first.expand_as(adv))
    return adv[:, 0]


def test_grpo_by_hand() -> None:
    adv, ret = compute_advantage("grpo", token_level_rewards=REWARDS, response_mask=MASK, index=UIDS)
    # group a: s = 1, 0, 1; mu = 2/3; unbiased var = ((1/3)^2 + (2/3)^2 + (1/3)^2) / 2 = 1/3;
    #          sigma = sqrt(1/3) = 0.57735; A = (1/3)/0.57735 = 0.57735, (-2/3)/0.57735 = -1.15470
    # group b: one response: mu = 0, sigma = 1; A = 0.5 / (1 + 1e-6)
    # group c: all equal: A = 0 / (0 + 1e-6) = 0
    sigma_a = math.sqrt(1 / 3)
    expected = torch.tensor(
        [
            (1 / 3) / (sigma_a + 1e-6),
            (-2 / 3) / (sigma_a + 1e-6),
            (1 / 3) / (sigma_a + 1e-6),
            0.5 / (1 + 1e-6),
            0.0,
            0.0,
        ]
    )
    assert torch.allclose(per_row(adv, MASK), expected, atol=1e-6)
    assert torch.equal(adv, ret)


def test_dr_grpo_has_no_std() -> None:
    adv, _ = compute_advantage(
        "grpo", token_level_rewards=REWARDS, response_mask=MASK, index=UIDS, norm_adv_by_std_in_grpo=False
    )
    # A = s - mu: group a 1 - 2/3, 0 - 2/3, 1 - 2/3; b 0.5 - 0; c 0
    expected = torch.tensor([1 / 3, -2 / 3, 1 / 3, 0.5, 0.0, 0.0])
    assert torch.allclose(per_row(adv, MASK), expected, atol=1e-6)


def test_grpo_epsilon_is_used() -> None:
    adv, _ = compute_advantage(
        "grpo", token_level_rewards=REWARDS, response_mask=MASK, index=UIDS, epsilon=1.0
    )
    # group b: 0.5 / (1 + 1)
    assert adv[3, 0].item() == pytest.approx(0.25)


@pytest.mark.parametrize(
    "index",
    [
        np.array(UIDS, dtype=object),
        np.array([10, 10, 10, 11, 12, 12]),
        torch.tensor([7, 7, 7, 3, 5, 5]),
        [("p", 1), ("p", 1), ("p", 1), ("q", 0), ("r", 2), ("r", 2)],
    ],
    ids=["numpy-str", "numpy-int", "tensor", "tuples"],
)
def test_grpo_accepts_any_hashable_index(index: object) -> None:
    ref, _ = compute_advantage("grpo", token_level_rewards=REWARDS, response_mask=MASK, index=UIDS)
    adv, _ = compute_advantage("grpo", token_level_rewards=REWARDS, response_mask=MASK, index=index)
    assert torch.equal(adv, ref)


def test_grpo_groups_need_not_be_contiguous() -> None:
    perm = [5, 2, 0, 3, 4, 1]
    ref, _ = compute_advantage("grpo", token_level_rewards=REWARDS, response_mask=MASK, index=UIDS)
    adv, _ = compute_advantage(
        "grpo", token_level_rewards=REWARDS[perm], response_mask=MASK[perm], index=[UIDS[i] for i in perm]
    )
    assert torch.allclose(adv, ref[perm])


def test_all_equal_rewards_give_zero_advantage() -> None:
    rewards = torch.zeros(4, 3)
    rewards[:, -1] = 1.0
    adv, _ = compute_advantage(
        "grpo", token_level_rewards=rewards, response_mask=torch.ones(4, 3), index=[0] * 4
    )
    assert (adv == 0).all()


@pytest.mark.parametrize(
    "name", ["grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gae"]
)
def test_empty_responses_give_no_nan(name: str) -> None:
    mask = MASK.clone()
    mask[1] = 0  # one empty response
    kwargs = dict(token_level_rewards=REWARDS * mask, index=UIDS, values=torch.full_like(REWARDS, 0.1))
    adv, ret = compute_advantage(name, response_mask=mask, **kwargs)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert (adv[1] == 0).all()
    # and a batch of nothing but empty responses
    adv, ret = compute_advantage(name, response_mask=torch.zeros_like(MASK), **kwargs)
    assert torch.isfinite(adv).all() and (adv == 0).all()


def test_rloo_by_hand() -> None:
    adv, ret = compute_advantage("rloo", token_level_rewards=REWARDS, response_mask=MASK, index=UIDS)
    # group a (1, 0, 1): A_0 = 1 - (0 + 1)/2 = 0.5, A_1 = 0 - (1 + 1)/2 = -1, A_2 = 1 - (1 + 0)/2 = 0.5
    # group b (0.5): no other response, baseline 0 -> A = 0.5 (as VERL; GRPO also uses mu = 0)
    # group c (2, 2): 2 - 2 = 0
    expected = torch.tensor([0.5, -1.0, 0.5, 0.5, 0.0, 0.0])
    assert torch.allclose(per_row(adv, MASK), expected, atol=1e-6)
    assert torch.equal(adv, ret)


def test_rloo_pair() -> None:
    rewards = torch.tensor([[3.0], [1.0]])
    adv, _ = compute_advantage(
        "rloo", token_level_rewards=rewards, response_mask=torch.ones(2, 1), index=[0, 0]
    )
    # 3 - 1, 1 - 3
    assert adv.flatten().tolist() == [2.0, -2.0]


def test_reinforce_plus_plus_by_hand() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = compute_advantage(
        "reinforce_plus_plus", token_level_rewards=rewards, response_mask=mask, gamma=0.5
    )
    # Returns G_t = r_t + 0.5 G_{t+1}, the running return reset after the last response token:
    #   row 0: G_2 = 1, G_1 = 0.5, G_0 = 0.25
    #   row 1: G_2 = 5 (outside the mask; reset to 0 before t = 1), G_1 = 1, G_0 = 0.5
    assert torch.allclose(ret, torch.tensor([[0.25, 0.5, 1.0], [0.5, 1.0, 5.0]]))
    # Whiten the 5 masked returns 0.25, 0.5, 1, 0.5, 1: mean 3.25/5 = 0.65;
    # deviations -0.4, -0.15, 0.35, -0.15, 0.35; squares sum 0.45; unbiased var 0.45/4 = 0.1125
    std = math.sqrt(0.1125 + 1e-8)
    expected = torch.tensor([[-0.4, -0.15, 0.35], [-0.15, 0.35, 0.0]]) / std
    assert torch.allclose(adv, expected, atol=1e-6)


def test_reinforce_plus_plus_baseline_by_hand() -> None:
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [2.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1]])
    adv, ret = compute_advantage(
        "reinforce_plus_plus_baseline", token_level_rewards=rewards, response_mask=mask, index=["a", "a", "b"]
    )
    # s = 1, 0, 2; group a mean 0.5 -> 0.5, -0.5; group b alone, mean 0 -> 2
    # broadcast: 0.5, 0.5 | -0.5 | 2, 2; mean 4.5/5 = 0.9; deviations -0.4 -0.4 -1.4 1.1 1.1;
    # squares 0.16 + 0.16 + 1.96 + 1.21 + 1.21 = 4.7; unbiased var 4.7/4 = 1.175
    std = math.sqrt(1.175 + 1e-8)
    expected = torch.tensor([[-0.4, -0.4], [-1.4, 0.0], [1.1, 1.1]]) / std
    assert torch.allclose(adv, expected, atol=1e-6)
    assert torch.equal(adv, ret)


def test_gae_by_hand() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    values = torch.tensor([[0.2, 0.4, 0.6], [0.3, 0.5, 9.9]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = compute_advantage(
        "gae", token_level_rewards=rewards, response_mask=mask, values=values, gamma=0.9, lam=0.5
    )
    # delta_t = r_t + 0.9 V_{t+1} - V_t,  A_t = delta_t + 0.45 A_{t+1}
    # row 0: t2: delta 1 - 0.6 = 0.4, A 0.4
    #        t1: delta 0.9*0.6 - 0.4 = 0.14, A 0.14 + 0.45*0.4 = 0.32
    #        t0: delta 0.9*0.4 - 0.2 = 0.16, A 0.16 + 0.45*0.32 = 0.304
    # row 1 (t2 outside the mask: V_3 and A_3 treated as 0 for t1):
    #        t1: delta 1 - 0.5 = 0.5, A 0.5
    #        t0: delta 0.9*0.5 - 0.3 = 0.15, A 0.15 + 0.45*0.5 = 0.375
    raw = torch.tensor([[0.304, 0.32, 0.4], [0.375, 0.5, 0.0]])
    m = mask.bool()
    # returns = raw A + V
    assert torch.allclose(ret[m], (raw + values)[m])
    # whitened over the 5 masked entries: mean 1.899/5 = 0.3798, unbiased var 0.0242008/4 = 0.0060502
    expected = (raw - 0.3798) / math.sqrt(0.0060502 + 1e-8) * mask
    assert torch.allclose(adv, expected, atol=1e-5)


def test_gae_needs_values() -> None:
    with pytest.raises(ValueError, match="'gae' needs values"):
        compute_advantage("gae", token_level_rewards=REWARDS, response_mask=MASK)


def test_outcome_estimators_need_an_index_of_the_right_length() -> None:
    with pytest.raises(ValueError, match="pass index"):
        compute_advantage("grpo", token_level_rewards=REWARDS, response_mask=MASK)
    with pytest.raises(ValueError, match="index has 2 entries; expected one per response \\(6\\)"):
        compute_advantage("rloo", token_level_rewards=REWARDS, response_mask=MASK, index=["a", "b"])


def test_input_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match=r"response_mask shape \(6, 3\) does not match"):
        AdvantageInput(token_level_rewards=REWARDS, response_mask=MASK[:, :3])
    with pytest.raises(ValueError, match="floating-point"):
        AdvantageInput(token_level_rewards=MASK, response_mask=MASK)
    with pytest.raises(TypeError):
        compute_advantage("grpo", token_level_rewards=REWARDS, response_mask=MASK, idx=UIDS)


def test_registry() -> None:
    assert set(ADV_ESTIMATORS) == {
        "gae",
        "grpo",
        "rloo",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
    }
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'; valid names: gae, grpo, rloo"):
        ADV_ESTIMATORS["ppo"]


def test_estimators_do_not_track_gradients() -> None:
    rewards = REWARDS.clone().requires_grad_(True)
    adv, _ = compute_advantage("grpo", token_level_rewards=rewards, response_mask=MASK, index=UIDS)
    assert not adv.requires_grad


def loop_grpo(scores: list[float], uids: list[int], norm: bool, eps: float = 1e-6) -> list[float]:
    """The formula written group by group, with torch.std (unbiased) as the reference."""
    out = []
    for s, u in zip(scores, uids, strict=True):
        group = torch.tensor([x for x, v in zip(scores, uids, strict=True) if v == u], dtype=torch.float64)
        mu, sigma = (group.mean(), group.std()) if len(group) > 1 else (0.0, 1.0)
        out.append(float((s - mu) / (sigma + eps)) if norm else float(s - mu))
    return out


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(
        st.tuples(st.sampled_from([0.0, 0.5, 1.0, -1.0, 2.25]), st.integers(0, 4)), min_size=1, max_size=24
    ),
    norm=st.booleans(),
)
def test_property_grpo_matches_group_loop(data: list[tuple[float, int]], norm: bool) -> None:
    scores = [s for s, _ in data]
    uids = [u for _, u in data]
    rewards = torch.zeros(len(data), 2, dtype=torch.float64)
    rewards[:, 1] = torch.tensor(scores, dtype=torch.float64)
    adv, _ = compute_advantage(
        "grpo",
        token_level_rewards=rewards,
        response_mask=torch.ones(len(data), 2),
        index=uids,
        norm_adv_by_std_in_grpo=norm,
    )
    assert torch.allclose(adv[:, 0], torch.tensor(loop_grpo(scores, uids, norm), dtype=torch.float64))
