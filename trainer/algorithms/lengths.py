"""The capped log-normal that response lengths are drawn from: pure arithmetic on plain numbers
(no torch), shared by the trainer's per-row draw (trainer.rollout.target_lengths) and the plugin's
workload arithmetic, so a replay draws exactly the lengths its recorded workload describes.

X = exp(mu + sigma Z), Z standard normal; a draw above the cap c becomes c. Its mean is the partial
expectation below the cap plus the cap's mass:
    E[min(X, c)] = exp(mu + sigma^2/2) Phi((ln c - mu - sigma^2)/sigma) + c (1 - Phi((ln c - mu)/sigma))
(e.g. Wikipedia, "Log-normal distribution", partial expectation).
"""

from __future__ import annotations

import math


def _phi(x: float) -> float:
    """The standard normal CDF."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def truncated_lognormal_mean(mu: float, sigma: float, cap: float) -> float:
    """E[min(X, cap)] for X = exp(mu + sigma Z): the partial mean below the cap plus the cap's mass."""
    log_cap = math.log(cap)
    below = math.exp(mu + sigma * sigma / 2) * _phi((log_cap - mu - sigma * sigma) / sigma)
    return below + cap * (1.0 - _phi((log_cap - mu) / sigma))


def lognormal_mu(mean: float, sigma: float, cap: float) -> float:
    """The mu whose log-normal, capped at ``cap``, has mean ``mean`` (bisection: the mean rises with mu)."""
    if not 0 < mean < cap:
        raise ValueError(f"a log-normal capped at {cap:g} needs 0 < mean < cap, found mean {mean:g}")
    if sigma <= 0:
        raise ValueError(f"a log-normal needs sigma > 0, found {sigma:g}")
    low, high = math.log(mean) - 10 * sigma - 10, math.log(cap) + 10 * sigma
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if truncated_lognormal_mean(mid, sigma, cap) < mean else (low, mid)
    return (low + high) / 2
