"""The one-sided Mann-Whitney U (Wilcoxon rank-sum) test, as plain functions on lists of numbers.

Whether one sample set tends to be larger than another, from ranks alone: no assumption about the
shape of the timing noise, which on a shared machine is skewed and heavy-tailed. asv
(asv/step_detect.py, ``mann_whitney_u``) and Google Benchmark (tools/gbench/report.py, the "U Test")
gate benchmarks with it. Definitions follow Mann & Whitney (1947), "On a test of whether one of two
random variables is stochastically larger than the other", and, for ties, Hollander, Wolfe & Chicken,
"Nonparametric Statistical Methods" (3rd ed.), section 4.1: tied values get their mean rank.

- Small samples (``n + m <= EXACT_MAX_TOTAL``): the exact p-value, the share of all C(n+m, n) ways to
  split the pooled ranks into the two sets whose rank sum for ``x`` is at least the observed one
  (counted by dynamic programming over rank sums; tied values keep their mean rank, so this is the
  exact test conditional on the ties).
- Larger samples: the normal approximation with the tie correction of the variance and a continuity
  correction of 1/2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# Up to this many values in all, the p-value is counted exactly (a few hundred thousand additions).
EXACT_MAX_TOTAL = 30


def doubled_midranks(values: Sequence[float]) -> list[int]:
    """Twice each value's rank in ``values`` (1-based), tied values sharing their mean rank; doubled so
    that a mean of two ranks is still an integer."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for i in order[start : end + 1]:
            ranks[i] = start + end + 2  # (start + 1) + (end + 1): twice the mean rank
        start = end + 1
    return ranks


def u_statistic(x: Sequence[float], y: Sequence[float]) -> float:
    """Mann-Whitney U of ``x``: the pairs (x_i, y_j) with x_i > y_j, a tie counting one half."""
    return sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in x for b in y)


def _exact_p_greater(x: Sequence[float], y: Sequence[float]) -> float:
    ranks = doubled_midranks([*x, *y])
    n = len(x)
    observed = sum(ranks[:n])
    top = sum(sorted(ranks)[-n:])
    # ways[k][s]: subsets of k of the ranks seen so far whose doubled ranks sum to s.
    ways = [[0] * (top + 1) for _ in range(n + 1)]
    ways[0][0] = 1
    for seen, r in enumerate(ranks, start=1):
        for k in range(min(seen, n), 0, -1):
            below, row = ways[k - 1], ways[k]
            for s in range(top, r - 1, -1):
                if below[s - r]:
                    row[s] += below[s - r]
    return sum(ways[n][observed:]) / math.comb(len(ranks), n)


def _normal_p_greater(x: Sequence[float], y: Sequence[float]) -> float:
    n, m = len(x), len(y)
    total = n + m
    pooled = sorted([*x, *y])
    ties = 0
    i = 0
    while i < total:
        j = i
        while j + 1 < total and pooled[j + 1] == pooled[i]:
            j += 1
        t = j - i + 1
        ties += t**3 - t
        i = j + 1
    variance = n * m / 12 * ((total + 1) - ties / (total * (total - 1)))
    if variance <= 0:  # every value equal: no evidence either way
        return 1.0
    z = (u_statistic(x, y) - n * m / 2 - 0.5) / math.sqrt(variance)
    return 0.5 * math.erfc(z / math.sqrt(2))


def p_greater(x: Sequence[float], y: Sequence[float]) -> float:
    """One-sided p-value of the hypothesis that ``x`` tends to be larger than ``y``: the probability,
    were both drawn from one distribution, of a U of ``x`` at least as large as the one observed.

    Exact up to ``EXACT_MAX_TOTAL`` values in all, the normal approximation beyond. Each side needs at
    least one value (ValueError otherwise)."""
    if not x or not y:
        raise ValueError(f"the rank test needs values on both sides, got {len(x)} and {len(y)}")
    if len(x) + len(y) <= EXACT_MAX_TOTAL:
        return _exact_p_greater(x, y)
    return _normal_p_greater(x, y)


def smallest_p(n: int, m: int) -> float:
    """The smallest one-sided p-value that n and m distinct values can give: every x above every y,
    one of the C(n+m, n) equally likely splits."""
    return 1 / math.comb(n + m, n)


def rounds_needed(alpha: float) -> int:
    """The fewest values per side (n = m) whose most extreme ranking has a p-value below ``alpha``."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    n = 1
    while smallest_p(n, n) >= alpha:
        n += 1
    return n
