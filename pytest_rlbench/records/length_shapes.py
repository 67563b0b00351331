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
mean still has per-sequence lengths for FLOPs and KV-cache traffic (``pytest_rlbench.verdict.derived``).
Pure arithmetic on plain numbers.
"""

from __future__ import annotations

import math
from statistics import NormalDist

# The one definition of the capped log-normal, shared with the trainer's per-row draw, so that a replay
# draws exactly the lengths its recorded workload describes.
from trainer.algorithms.lengths import lognormal_mu, truncated_lognormal_mean  # noqa: F401

CONSTANT = "constant"
LOGNORMAL = "lognormal"
NATURAL = "natural"
SHAPES: tuple[str, ...] = (CONSTANT, LOGNORMAL, NATURAL)

_STD_NORMAL = NormalDist()


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
