"""Advantage estimators, chosen by name, as VERL's ``compute_*_outcome_advantage`` and
``compute_gae_advantage_return`` (verl/trainer/ppo/core_algos.py).

Sources: GAE (Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
Estimation"); GRPO (Shao et al. 2024, "DeepSeekMath"); RLOO (Ahmadian et al. 2024, "Back to Basics:
Revisiting REINFORCE Style Optimization for Learning from Human Feedback in LLMs"); REINFORCE++
(Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models").

Every estimator takes one ``AdvantageInput`` and returns ``(advantages, returns)``, both [B, T]
over the response tokens. The outcome estimators (grpo, rloo, reinforce_plus_plus_baseline) reduce
each response to one score s_i = sum_t r_it and compare it with the other responses to the same
prompt: the group g(i) of responses whose ``index`` (the prompt's uid) equals index[i].

    ADV_ESTIMATORS["grpo"](AdvantageInput(token_level_rewards=r, response_mask=m, index=uids))
    compute_advantage("grpo", token_level_rewards=r, response_mask=m, index=uids)

``ADV_ESTIMATORS`` is the one list of valid names (config validation reads it); a plugin adds an
estimator with ``@ADV_ESTIMATORS.register("name")``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trainer.algorithms.aggregation import masked_whiten
from trainer.registry import Registry


@dataclass
class AdvantageInput:
    """What an estimator may read. Each estimator says which fields it needs.

    token_level_rewards: r [B, T], the reward per response token (KL penalty already in, if used).
    response_mask: m [B, T], 1 on response tokens (EOS included), 0 on padding.
    index: the group (prompt uid) of each of the B responses: a list, numpy array or tensor.
    values: V [B, T], the critic's values (GAE only).
    gamma: discount; lam: GAE's lambda.
    norm_adv_by_std_in_grpo: divide by the group's std (GRPO) or not (Dr.GRPO).
    epsilon: added to sigma before dividing.
    """

    token_level_rewards: torch.Tensor
    response_mask: torch.Tensor
    index: Sequence[Hashable] | Any | None = None
    values: torch.Tensor | None = None
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    epsilon: float = 1e-6

    def __post_init__(self) -> None:
        r, m = self.token_level_rewards, self.response_mask
        if not r.is_floating_point():
            raise ValueError(f"token_level_rewards must be a floating-point tensor; got {r.dtype}")
        if r.dim() != 2:
            raise ValueError(f"token_level_rewards must be [B, T]; got shape {tuple(r.shape)}")
        if m.shape != r.shape:
            raise ValueError(
                f"response_mask shape {tuple(m.shape)} does not match token_level_rewards {tuple(r.shape)}"
            )
        if self.values is not None and self.values.shape != r.shape:
            raise ValueError(
                f"values shape {tuple(self.values.shape)} does not match token_level_rewards {tuple(r.shape)}"
            )


AdvantageFn = Callable[[AdvantageInput], tuple[torch.Tensor, torch.Tensor]]
ADV_ESTIMATORS: Registry[AdvantageFn] = Registry("advantage estimator")


# ---------------------------------------------------------------------------------------------
# Groups
# ---------------------------------------------------------------------------------------------


def group_ids(index: Sequence[Hashable] | Any, batch_size: int) -> tuple[torch.Tensor, int]:
    """Map each sample's uid to a dense group id 0..G-1 (first appearance order); returns (ids, G)."""
    if index is None:
        raise ValueError("this estimator groups responses by prompt: pass index (one uid per response)")
    uids = index.tolist() if hasattr(index, "tolist") else list(index)
    if len(uids) != batch_size:
        raise ValueError(f"index has {len(uids)} entries; expected one per response ({batch_size})")
    dense: dict[Hashable, int] = {}
    ids = [dense.setdefault(u, len(dense)) for u in uids]
    return torch.tensor(ids, dtype=torch.long), len(dense)


def group_stats(
    scores: torch.Tensor, gid: torch.Tensor, num_groups: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample (n_g, mu_g, sigma_g) of the sample's group g, sigma the unbiased std.

    A group of one has mu = 0 and sigma = 1 (as VERL): its only response is compared with 0.
    """
    gid = gid.to(scores.device)
    n = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device).index_add_(
        0, gid, torch.ones_like(scores)
    )
    total = torch.zeros_like(n).index_add_(0, gid, scores)
    mu = total / n
    sq_dev = torch.zeros_like(n).index_add_(0, gid, (scores - mu[gid]) ** 2)
    # Unbiased: divide by n - 1; clamp only matters for n = 1, which is overridden below.
    sigma = torch.sqrt(sq_dev / (n - 1).clamp_min(1))
    single = n == 1
    mu = torch.where(single, torch.zeros_like(mu), mu)
    sigma = torch.where(single, torch.ones_like(sigma), sigma)
    return n[gid], mu[gid], sigma[gid]


def _scores(inp: AdvantageInput) -> torch.Tensor:
    """s_i = sum_t r_it (outcome reward: one number per response)."""
    return inp.token_level_rewards.sum(dim=-1)


# ---------------------------------------------------------------------------------------------
# Estimators
# ---------------------------------------------------------------------------------------------


@ADV_ESTIMATORS.register("gae")
@torch.no_grad()
def gae(inp: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation with a critic V.

    delta_t = r_t + gamma V_{t+1} - V_t;  A_t = delta_t + gamma lam A_{t+1};  returns R_t = A_t + V_t;
    advantages are then whitened over the batch under the mask (as VERL).
    Masked-out positions are skipped: V_{t+1} and A_{t+1} are those of the next position in the mask.
    """
    if inp.values is None:
        raise ValueError("estimator 'gae' needs values (the critic's V [B, T]); got None")
    r, v = inp.token_level_rewards, inp.values
    m = inp.response_mask.to(r.dtype)
    gamma, lam = inp.gamma, inp.lam
    T = r.shape[-1]
    next_value = torch.zeros_like(r[:, 0])
    next_adv = torch.zeros_like(r[:, 0])
    adv_reversed = []
    for t in reversed(range(T)):
        delta = r[:, t] + gamma * next_value - v[:, t]
        a_t = delta + gamma * lam * next_adv
        # Outside the mask, carry the later values through unchanged.
        next_value = v[:, t] * m[:, t] + (1 - m[:, t]) * next_value
        next_adv = a_t * m[:, t] + (1 - m[:, t]) * next_adv
        adv_reversed.append(next_adv)
    advantages = torch.stack(adv_reversed[::-1], dim=1)
    returns = advantages + v
    advantages = masked_whiten(advantages, m) * m
    return advantages, returns


@ADV_ESTIMATORS.register("grpo")
@torch.no_grad()
def grpo(inp: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage: A_i = (s_i - mu_g) / (sigma_g + epsilon), broadcast over tokens x mask.

    mu_g, sigma_g: mean and unbiased std of the scores in i's group; a group of one has mu = 0,
    sigma = 1. With norm_adv_by_std_in_grpo=False (Dr.GRPO): A_i = s_i - mu_g.
    Returns (A, A): outcome estimators have no separate return.
    """
    s = _scores(inp)
    gid, num_groups = group_ids(inp.index, s.shape[0])
    _, mu, sigma = group_stats(s, gid, num_groups)
    if inp.norm_adv_by_std_in_grpo:
        a = (s - mu) / (sigma + inp.epsilon)
    else:
        a = s - mu
    advantages = a.unsqueeze(-1) * inp.response_mask.to(a.dtype)
    return advantages, advantages


@ADV_ESTIMATORS.register("rloo")
@torch.no_grad()
def rloo(inp: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: A_i = s_i - (1/(n-1)) sum_{j in g, j != i} s_j  =  n/(n-1) (s_i - mu_g).

    A group of one has no other response: its baseline is taken as 0, so A_i = s_i. This is what
    VERL's rloo does, and it matches GRPO's choice (mu = 0 for a single response). Returning 0
    instead would silently drop the sample's learning signal.
    """
    s = _scores(inp)
    gid, num_groups = group_ids(inp.index, s.shape[0])
    n, mu, _ = group_stats(s, gid, num_groups)
    # Sum of the others = n mu - s_i; for n = 1 the (zero) baseline is used instead.
    baseline_others = torch.where(n > 1, (n * mu - s) / (n - 1).clamp_min(1), torch.zeros_like(s))
    a = s - baseline_others
    advantages = a.unsqueeze(-1) * inp.response_mask.to(a.dtype)
    return advantages, advantages


@ADV_ESTIMATORS.register("reinforce_plus_plus")
@torch.no_grad()
def reinforce_plus_plus(inp: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: G_t = r_t + gamma G_{t+1} per token (KL penalty already in r), then
    A = whiten(G) over all masked tokens of the batch, times the mask. Returns (A, G).

    The running return restarts after the last response token (it is multiplied by the mask).
    """
    r = inp.token_level_rewards
    m = inp.response_mask.to(r.dtype)
    returns = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    for t in reversed(range(r.shape[-1])):
        running = r[:, t] + inp.gamma * running
        returns[:, t] = running
        running = running * m[:, t]
    advantages = masked_whiten(returns, m) * m
    return advantages, returns


@ADV_ESTIMATORS.register("reinforce_plus_plus_baseline")
@torch.no_grad()
def reinforce_plus_plus_baseline(inp: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline: A_it = whiten_batch(s_i - mu_g) x m_it.

    mu_g is the group mean (0 for a group of one); the difference is broadcast over the response
    tokens and then whitened over all masked tokens of the batch. Returns (A, A).
    """
    s = _scores(inp)
    gid, num_groups = group_ids(inp.index, s.shape[0])
    _, mu, _ = group_stats(s, gid, num_groups)
    m = inp.response_mask.to(s.dtype)
    centred = (s - mu).unsqueeze(-1) * m
    advantages = masked_whiten(centred, m) * m
    return advantages, advantages


def compute_advantage(name: str, **fields: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Run estimator ``name`` on ``AdvantageInput(**fields)``; returns (advantages, returns)."""
    return ADV_ESTIMATORS[name](AdvantageInput(**fields))
