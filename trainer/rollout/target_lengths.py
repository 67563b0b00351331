"""Per-row response-length targets (rollout.target_lengths, our extension): how many tokens each row
generates, drawn from a named distribution so that random weights do a baseline's ragged work.

A row's target depends only on (the step's rollout seed, the row's key) -- the key the engines
already give each row for its sampling noise (u * n + j for response j of prompt uid u, see
``sampling.keyed_exponential``) -- so a row gets the same target whichever worker or micro-batch it
lands in. The draw is a counter-based hash (``sampling.mix32``) turned into a uniform u in (0, 1) and
then a standard normal z = Phi^-1(u), computed in float64 on the CPU so that every process and
device gets the same integers.

The distributions (``DISTRIBUTIONS``, the one list of valid names; ``NO_TARGETS`` is registered
there with no distribution) map z to a real length; ``draw_targets`` rounds half up and clamps to
[1, cap]:
- constant: ``mean`` for every row;
- lognormal: X = exp(mu + sigma z), and a draw above the cap becomes the cap (the truncated mass sits
  on the cap, as a real rollout stops at max_response_length). mu is chosen so that the mean *after*
  that truncation is ``mean`` (``lognormal_mu``): a source publishes the mean of the lengths its
  responses really had, all of them at most the cap. The partial expectation behind it:
  E[min(X, c)] = exp(mu + sigma^2/2) Phi((ln c - mu - sigma^2)/sigma) + c (1 - Phi((ln c - mu)/sigma))
  (e.g. Wikipedia, "Log-normal distribution", partial expectation; NIST/SEMATECH e-Handbook of
  Statistical Methods, section 1.3.6.6.9).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from trainer.algorithms.lengths import lognormal_mu, truncated_lognormal_mean  # noqa: F401  (re-exported)
from trainer.registry import Registry
from trainer.rollout.sampling import M32, mix32

NO_TARGETS = "none"  # rows end at EOS or at max_response_length, as without this extension
_TARGET_STREAM = 0x7A3C_51D9  # separates the target's hash from the token noise of the same row key

# A distribution maps standard normals z [B] (float64) to real lengths [B], given (mean, sigma, cap).
Distribution = Callable[[torch.Tensor, float, float, float], torch.Tensor]


def constant_lengths(z: torch.Tensor, mean: float, sigma: float, cap: float) -> torch.Tensor:
    """Every row ``mean`` tokens (sigma unused)."""
    return torch.full_like(z, float(mean))


def lognormal_lengths(z: torch.Tensor, mean: float, sigma: float, cap: float) -> torch.Tensor:
    """exp(mu + sigma z), mu = lognormal_mu(mean, sigma, cap): once capped, the mean is ``mean``."""
    if sigma == 0:
        return torch.full_like(z, float(mean))
    return torch.exp(lognormal_mu(mean, sigma, cap) + sigma * z)


# rollout.target_lengths.distribution -> its distribution; "none" has none (no targets)
DISTRIBUTIONS: Registry[Distribution | None] = Registry("target-length distribution")
DISTRIBUTIONS.register(NO_TARGETS, None)
DISTRIBUTIONS.register("constant", constant_lengths)
DISTRIBUTIONS.register("lognormal", lognormal_lengths)


def keyed_normals(row_keys: torch.Tensor, seed: int) -> torch.Tensor:
    """One standard normal per row [B] (float64, CPU) that depends only on (seed, row key)."""
    keys = row_keys.detach().to("cpu", torch.long)
    h = mix32((keys * 0x9E3779B1 + (seed & M32)) & M32)
    h = mix32((h ^ _TARGET_STREAM) & M32)
    u = (h.double() + 0.5) / float(1 << 32)  # in (0, 1): never 0 or 1
    return torch.special.ndtri(u)


def draw_targets(
    distribution: str, mean: float, sigma: float, row_keys: torch.Tensor, seed: int, cap: int
) -> torch.Tensor | None:
    """Each row's target length [B] (int64, CPU) in [1, cap], or None for ``NO_TARGETS``."""
    draw = DISTRIBUTIONS[distribution]
    if draw is None:
        return None
    if cap < 1:
        raise ValueError(f"the target-length cap (max_response_length) must be >= 1, got {cap}")
    lengths = draw(keyed_normals(row_keys, seed), mean, sigma, cap)
    return torch.floor(lengths + 0.5).clamp(1, cap).long()  # round half up, then into [1, cap]
