"""A statistical check that a rollout engine samples from the policy it is given.

If token y is drawn from p = softmax(logits / T), then E[log p(y)] = -H(p): the mean log-prob of the
sampled tokens under a reference forward equals minus the mean entropy of the reference
distributions at those positions. Per token, d = log p(y) + H(p) has mean zero; it is a martingale
difference (its mean is zero given everything sampled before it), so the d's of one response are
uncorrelated and the standard error of their mean is std(d) / sqrt(n) over all tokens.

A wrong temperature, stale weights, a broken KV cache or attention mask, or a biased sampler all make
the engine draw from some q != p, and then E[d] = sum_y (q(y) - p(y)) log p(y), which such faults make
nonzero (a hotter q puts mass on unlikely tokens: E[d] < 0; a colder one on likely tokens: > 0): the check
fails when |mean(d)| exceeds ``limit`` standard errors (4 by default: a false alarm about once in
16,000 runs). It judges plain sampling only: with top-k/top-p the engine draws from a truncated p.

The reference may be an fp32 forward of the policy (it tests the engine's model and sampler together,
and a bf16 engine's own rounding moves the gap: ``precision_shift``), or the engine's own distribution
q, from the log-probs and entropies it reports (it tests the sampler alone, exactly at any precision).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

DEFAULT_LIMIT = 4.0  # standard errors


@dataclass(frozen=True)
class SamplingCheck:
    """The statistic over ``tokens`` sampled tokens, and whether it lies within ``limit`` s.e. of 0."""

    tokens: int
    mean_log_prob: float  # mean log p(y) under the reference
    mean_entropy: float  # mean H(p) of the reference distributions at those positions
    gap: float  # mean_log_prob + mean_entropy: 0 for a correct sampler
    stderr: float
    limit: float

    @property
    def z(self) -> float:
        """The gap in standard errors (inf for a nonzero gap with no spread)."""
        if self.stderr > 0:
            return self.gap / self.stderr
        return 0.0 if self.gap == 0 else math.copysign(math.inf, self.gap)

    @property
    def passed(self) -> bool:
        return abs(self.z) <= self.limit

    def describe(self, name: str = "sampling check") -> str:
        verdict = "passes" if self.passed else "FAILS"
        return (
            f"{name} {verdict}: mean log-prob {self.mean_log_prob:.4f} vs minus mean entropy "
            f"{-self.mean_entropy:.4f} over {self.tokens} tokens: gap {self.gap:+.4f} nats = "
            f"{self.z:+.1f} s.e. (s.e. {self.stderr:.4f}, limit {self.limit:g} s.e.)"
        )


def sampling_check(
    log_probs: torch.Tensor, entropies: torch.Tensor, mask: torch.Tensor, limit: float = DEFAULT_LIMIT
) -> SamplingCheck:
    """The check over the tokens where ``mask`` is 1.

    log_probs [B, R]: log p(y) of each sampled token under the reference; entropies [B, R]: H(p) of the
    reference distribution that token was drawn from; both at the sampling temperature.
    """
    if log_probs.shape != entropies.shape or log_probs.shape != mask.shape:
        raise ValueError(
            f"log_probs, entropies and mask must have one shape; got {tuple(log_probs.shape)}, "
            f"{tuple(entropies.shape)}, {tuple(mask.shape)}"
        )
    if not limit > 0:
        raise ValueError(f"limit must be > 0 standard errors, got {limit}")
    keep = mask.bool()
    lp = log_probs.double()[keep]  # [N]
    h = entropies.double()[keep]  # [N]
    n = lp.numel()
    if n < 2:
        raise ValueError(f"the sampling check needs at least 2 sampled tokens, got {n}")
    d = lp + h  # [N] zero mean under correct sampling
    return SamplingCheck(
        tokens=n,
        mean_log_prob=float(lp.mean()),
        mean_entropy=float(h.mean()),
        gap=float(d.mean()),
        stderr=float(d.std() / math.sqrt(n)),
        limit=limit,
    )


def precision_shift(
    judge_log_probs: torch.Tensor, judge_entropies: torch.Tensor,
    engine_log_probs: torch.Tensor, engine_entropies: torch.Tensor, mask: torch.Tensor,
) -> float:
    """The part of a judge's gap that the engine's own distributions make, in nats per token.

    With p the judge's distributions and q the engine's: mean(H(p) - H(q) + log p(y) - log q(y)) over
    the tokens where ``mask`` is 1 (all [B, R]). The judge's gap (``sampling_check`` under p) minus this
    is the gap under q (the sampler check), exactly. For a sampler drawing from q its expectation is
    H(p) - H(q) - KL(q || p): what a q computed at another precision than p moves the judge's gap by,
    however exact the sampler.
    """
    keep = mask.bool()
    shift = (judge_entropies.double() - engine_entropies.double()
             + judge_log_probs.double() - engine_log_probs.double())  # [B, R]
    return float(shift[keep].mean())
