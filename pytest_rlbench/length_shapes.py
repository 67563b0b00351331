"""Sequence-length distributions by name: "constant", "lognormal" (truncated at a cap) and "natural".

A source that publishes response lengths gives at most their mean and a cap; a workload names a shape
for the rest. The shapes, as the run-record's workload states them:

- "constant": every sequence has the mean length;
- "lognormal": X = exp(mu + sigma Z), Z standard normal, truncated at the cap with the truncated mass
  on the cap (a row that would run longer stops at max_response_length, as a real rollout does);
  mu is chosen so that the mean *after* truncation equals the stated mean;
- "natural": whatever the model generates (real data, or random weights stopping at EOS): no lengths
  can be computed from it.

``expected_lengths`` gives n representative lengths (the distribution's quantiles at (i + 1/2) / n,
nudged by whole tokens so that they sum to n x mean), so that a record whose source published only a
mean still has per-sequence lengths for FLOPs and KV-cache traffic (``pytest_rlbench.derived``).
Pure arithmetic on plain numbers.
"""

from __future__ import annotations

import math
from statistics import NormalDist

CONSTANT = "constant"
LOGNORMAL = "lognormal"
NATURAL = "natural"
SHAPES: tuple[str, ...] = (CONSTANT, LOGNORMAL, NATURAL)

_STD_NORMAL = NormalDist()


def truncated_lognormal_mean(mu: float, sigma: float, cap: float) -> float:
    """E[min(X, cap)] for X = exp(mu + sigma Z): the partial mean below the cap plus the cap's mass."""
    log_cap = math.log(cap)
    below = math.exp(mu + sigma * sigma / 2) * _STD_NORMAL.cdf((log_cap - mu - sigma * sigma) / sigma)
    return below + cap * (1 - _STD_NORMAL.cdf((log_cap - mu) / sigma))


def lognormal_mu(mean: float, sigma: float, cap: float) -> float:
    """The mu whose lognormal, truncated at ``cap``, has mean ``mean`` (bisection: the mean rises with mu)."""
    if not 0 < mean < cap:
        raise ValueError(f"a lognormal truncated at {cap:g} needs 0 < mean < cap, found mean {mean:g}")
    if sigma <= 0:
        raise ValueError(f"a lognormal needs sigma > 0, found {sigma:g}")
    low, high = math.log(mean) - 10 * sigma - 10, math.log(cap) + 10 * sigma
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if truncated_lognormal_mean(mid, sigma, cap) < mean else (low, mid)
    return (low + high) / 2


def _match_total(lengths: list[int], total: int, cap: int) -> list[int]:
    """Spread ``total - sum(lengths)`` over the entries, whole tokens each, none leaving 1..cap."""
    out = list(lengths)
    while (gap := total - sum(out)) != 0:
        room = [i for i, v in enumerate(out) if (v < cap if gap > 0 else v > 1)]
        if not room:
            break
        step = max(1, abs(gap) // len(room)) * (1 if gap > 0 else -1)
        for i in room[: abs(gap)]:
            out[i] = min(cap, max(1, out[i] + step))
    return out


def expected_lengths(
    shape: str, mean: float, n: int, cap: int | None = None, sigma: float | None = None
) -> list[int]:
    """n representative lengths of the shape, each in 1..cap, summing to round(n x mean): quantiles at
    (i + 1/2) / n, nudged; ValueError for a "natural" shape or missing parameters."""
    if shape == CONSTANT:
        return [max(1, round(mean))] * n
    if shape != LOGNORMAL:
        raise ValueError(
            f"no lengths can be computed for shape {shape!r}; expected {CONSTANT!r} or {LOGNORMAL!r}"
        )
    if cap is None or sigma is None:
        raise ValueError(f"a lognormal shape needs a cap and sigma, found cap {cap}, sigma {sigma}")
    mu = lognormal_mu(mean, sigma, cap)
    quantiles = [
        min(cap, max(1, round(math.exp(mu + sigma * _STD_NORMAL.inv_cdf((i + 0.5) / n))))) for i in range(n)
    ]
    return _match_total(quantiles, round(n * mean), cap)
