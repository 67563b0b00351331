"""The one-sided Mann-Whitney U test against values counted by hand."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from pytest_rlbench.verdict.rank_test import (
    EXACT_MAX_TOTAL,
    doubled_midranks,
    p_greater,
    rounds_needed,
    smallest_p,
    u_statistic,
)


def test_midranks_share_the_mean_rank_of_a_tie() -> None:
    assert doubled_midranks([3.0, 1.0, 2.0]) == [6, 2, 4]
    # 1 -> rank 1; the three 2s share ranks 2, 3, 4 (mean 3); 5 -> rank 5
    assert doubled_midranks([2.0, 1.0, 2.0, 5.0, 2.0]) == [6, 2, 6, 10, 6]


def test_u_counts_pairs_and_half_ties() -> None:
    assert u_statistic([3, 5], [1, 4]) == 3  # 3>1, 5>1, 5>4
    assert u_statistic([2, 2], [1, 2]) == 3  # 2>1 twice, 2=2 twice (halves)


def test_exact_p_values_counted_by_hand() -> None:
    # x = {3, 5}, y = {1, 4}: x's ranks {2, 4} sum to 6; of the C(4, 2) = 6 splits, sums 3 4 5 5 6 7:
    # two are at least 6
    assert p_greater([3, 5], [1, 4]) == pytest.approx(2 / 6)
    # every x above every y: one split of C(6, 3) = 20
    assert p_greater([6, 7, 8], [1, 2, 3]) == pytest.approx(1 / 20)
    assert p_greater([1, 2, 3], [6, 7, 8]) == pytest.approx(1.0)
    # five above five: 1 / C(10, 5) = 1/252; one swap: 2/252; a split like {2, 5, 7, 9, 10}: 31/252
    assert p_greater(range(6, 11), range(1, 6)) == pytest.approx(1 / 252)
    assert p_greater([5, 7, 8, 9, 10], [1, 2, 3, 4, 6]) == pytest.approx(2 / 252)


def test_ties_keep_their_mean_rank_in_the_exact_count() -> None:
    # pooled {1, 2, 2, 2}: ranks 1, 3, 3, 3; x = {2, 2} sums 6; of the 6 splits, three sum 6 and three 4
    assert p_greater([2, 2], [1, 2]) == pytest.approx(0.5)
    # all equal: no evidence either way
    assert p_greater([1.0, 1.0, 1.0], [1.0, 1.0, 1.0]) == pytest.approx(1.0)


def test_large_samples_use_the_normal_approximation() -> None:
    # 20 vs 20, every x above every y: U = 400, mean 200, sd sqrt(20 x 20 x 41 / 12) = 36.97;
    # z = (400 - 200 - 0.5) / 36.97 = 5.396, p = 0.5 erfc(z / sqrt 2) = 3.4e-8
    x, y = [float(v) for v in range(21, 41)], [float(v) for v in range(1, 21)]
    assert len(x) + len(y) > EXACT_MAX_TOTAL
    z = (400 - 200 - 0.5) / math.sqrt(20 * 20 * 41 / 12)
    assert p_greater(x, y) == pytest.approx(0.5 * math.erfc(z / math.sqrt(2)))
    assert p_greater(x, y) == pytest.approx(3.4e-8, rel=0.05)
    # interleaved, x the lower of each pair: U = 190 against a mean of 200, p a little above a half
    assert 0.5 < p_greater([float(v) for v in range(1, 41, 2)], [float(v) for v in range(2, 41, 2)]) < 0.7


def test_rounds_needed_to_reach_a_level() -> None:
    assert smallest_p(4, 4) == pytest.approx(1 / 70) and smallest_p(5, 5) == pytest.approx(1 / 252)
    assert rounds_needed(0.01) == 5  # 1/70 = 0.014 is not below 0.01; 1/252 = 0.004 is
    assert rounds_needed(0.05) == 4  # 1/20 = 0.05 is not below 0.05; 1/70 is
    with pytest.raises(ValueError, match="alpha must be in"):
        rounds_needed(0.0)
    with pytest.raises(ValueError, match="values on both sides, got 0 and 2"):
        p_greater([], [1.0, 2.0])


# Pinned to two oracles: scipy's exact test where it is valid (no ties; skipped without scipy, which
# stays out of the dependencies: its exact method ignores ties) and every split enumerated.
def _enumerated_p_greater(x: list[float], y: list[float]) -> float:
    """The share of all C(n+m, n) splits of the pooled midranks whose x-side sum reaches the observed one."""
    ranks = doubled_midranks([*x, *y])
    n, observed = len(x), sum(ranks[: len(x)])
    sums = [sum(ranks[i] for i in idx) for idx in itertools.combinations(range(len(ranks)), n)]
    return sum(s >= observed for s in sums) / len(sums)


def _pairs(levels: int | None, count: int, seed: int, max_side: int = 20, max_total: int = EXACT_MAX_TOTAL):
    rng = random.Random(seed)
    for _ in range(count):
        n = rng.randint(2, max_side)
        m = rng.randint(2, min(max_side, max_total - n))
        draw = (lambda: rng.random()) if levels is None else (lambda: float(rng.randrange(levels)))
        shift = rng.choice([0.0, 0.3, 1.0])
        yield [draw() + shift for _ in range(n)], [draw() for _ in range(m)]


def test_exact_p_values_match_scipy_without_ties() -> None:
    stats = pytest.importorskip("scipy.stats")
    for x, y in _pairs(None, 80, seed=1):
        expected = stats.mannwhitneyu(x, y, alternative="greater", method="exact").pvalue
        assert p_greater(x, y) == pytest.approx(float(expected), rel=1e-12, abs=1e-15), (x, y)


def test_normal_approximation_matches_scipy_asymptotic_with_ties() -> None:
    stats = pytest.importorskip("scipy.stats")
    for x, y in _pairs(3, 100, seed=2, max_total=40):
        if len(x) + len(y) <= EXACT_MAX_TOTAL:
            continue
        expected = stats.mannwhitneyu(x, y, alternative="greater", method="asymptotic", use_continuity=True).pvalue
        assert p_greater(x, y) == pytest.approx(float(expected), rel=1e-9), (x, y)


@pytest.mark.parametrize("levels", [2, 3, 5, None])
def test_exact_p_values_match_every_split_enumerated_with_ties(levels: int | None) -> None:
    for x, y in _pairs(levels, 60, seed=3, max_side=7, max_total=14):
        assert p_greater(x, y) == pytest.approx(_enumerated_p_greater(x, y), abs=1e-15), (x, y)
