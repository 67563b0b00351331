"""Sampling as small pure functions over a [B, V] logits tensor.

The static engine composes them once per decode step; each works on any device and keeps shapes
static (filters set logits to -inf rather than dropping columns), so a step can be graph-captured.
Order as in transformers: temperature, then top-k, then top-p, then sampling.
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")
TOP_P_ATOL = 1e-6  # float32 softmax sums are good to a few 1e-7


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / T. T must be > 0 (greedy decoding is ``do_sample=False``, not T = 0)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}; use do_sample=False for greedy decoding")
    if temperature == 1.0:
        return logits
    return logits / temperature


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits of each row (ties with the k-th value kept too); k <= 0 is off."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, NEG_INF)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter: keep the smallest set of most likely tokens whose probability sums to >= p.

    A token is kept when the mass of the tokens ranked above it is still below p, so the top token
    is always kept and the token that crosses p is included. p >= 1 is off. Sums within
    ``TOP_P_ATOL`` of p count as reaching it, so rounding in softmax does not decide an exact tie
    (probs [0.5, 0.3, ...] with p = 0.8 keep two tokens, not three).
    """
    if not 0.0 < p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {p}")
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits.float(), dim=-1)
    mass_above = torch.cumsum(probs, dim=-1) - probs
    drop_sorted = mass_above >= p - TOP_P_ATOL
    drop_sorted[..., 0] = False  # the most likely token always stays
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, NEG_INF)


def process_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Temperature, top-k and top-p in transformers' order."""
    return top_p_filter(top_k_filter(apply_temperature(logits, temperature), top_k), top_p)


def sample(logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row, drawn from softmax(logits): [B, V] -> [B] (long).

    Uses the exponential race (argmax of p_i / E_i with E_i ~ Exp(1)), which draws exactly from p
    like torch.multinomial but never raises a device-side assert on NaN or all-zero rows; callers
    detect those with ``nonfinite_rows_mask`` instead. Reproducible for a seeded ``generator``.
    """
    probs = torch.softmax(logits.float(), dim=-1)
    race = torch.empty_like(probs).exponential_(generator=generator)
    return torch.argmax(probs / race, dim=-1)


M32 = 0xFFFFFFFF


def mix32(h: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (lowbias32) on int64 tensors holding 32-bit values.

    Products may wrap past 2**63; masking keeps the low 32 bits, which two's complement preserves.
    """
    h = h ^ (h >> 16)
    h = (h * 0x7FEB352D) & M32
    h = h ^ (h >> 15)
    h = (h * 0x846CA68B) & M32
    return h ^ (h >> 16)


def row_hash(row_keys: torch.Tensor, seed: int | torch.Tensor) -> torch.Tensor:
    """Each row's 32-bit hash of (seed, row key) [B] int64: where its keyed noise starts (and the
    vllm engine's per-row seed)."""
    return mix32((row_keys.long() * 0x9E3779B1 + (seed & M32)) & M32)


def keyed_exponential(
    row_keys: torch.Tensor, step: torch.Tensor | int, vocab: int, seed: int | torch.Tensor
) -> torch.Tensor:
    """Exp(1) noise [B, V] that depends only on (seed, row key, step, token id).

    A counter-based hash instead of a generator's stream: a row draws the same noise whatever
    batch or worker it is in, so rollouts do not depend on how the batch is split over workers
    (1 and N data-parallel workers sample the same responses, and so do the same work). ``seed``
    may be a device tensor, so that a captured decode step reads this step's seed rather than baking one in.
    """
    keys = row_keys.long()
    step_t = torch.as_tensor(step, dtype=torch.long, device=keys.device)
    row = mix32((row_hash(keys, seed) ^ ((step_t * 0x85EBCA6B + 0x165667B1) & M32)) & M32)
    token = torch.arange(vocab, dtype=torch.long, device=keys.device) * 0x27D4EB2F
    h = mix32((row.unsqueeze(-1) + token) & M32)
    return -torch.log(hash_to_uniform(h))


UNIFORM_BITS = 23  # k + 0.5 with k < 2**23 needs 24 significant bits: exact in float32


def hash_to_uniform(h: torch.Tensor) -> torch.Tensor:
    """32-bit hashes -> float32 uniforms strictly inside (0, 1): (k + 0.5) / 2**23, k the top 23 bits.

    Strictly below 1 matters: the race divides by -log(u), and a u that rounds to 1 gives a zero
    that makes its token win whatever its probability (with 24 bits, (2**24 - 1) + 0.5 rounds to
    2**24 in float32, so about one decode step in a hundred at a 152k vocabulary picked a token
    uniformly at random).
    """
    return ((h >> (32 - UNIFORM_BITS)).float() + 0.5) * (1.0 / (1 << UNIFORM_BITS))


def sample_keyed(
    logits: torch.Tensor, row_keys: torch.Tensor, step: torch.Tensor | int, seed: int | torch.Tensor
) -> torch.Tensor:
    """``sample`` with the exponential race driven by ``keyed_exponential`` instead of a generator."""
    probs = torch.softmax(logits.float(), dim=-1)
    race = keyed_exponential(row_keys, step, logits.shape[-1], seed)
    return torch.argmax(probs / race, dim=-1)


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T) at each row's token: [B, V], [B] -> [B] float32.

    What the trainer's old_log_prob computes for the same token: the engine's own logits over the
    temperature, before top-k/top-p filtering. One gather and a logsumexp; no [B, V] result is kept.
    """
    scaled = logits.float() / temperature  # [B, V]
    picked = scaled.gather(-1, tokens.view(-1, 1)).squeeze(-1)  # [B]
    return picked - torch.logsumexp(scaled, dim=-1)


def token_entropies(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """H(softmax(logits / T)) of each row in nats: [B, V] -> [B] float32.

    The entropy of the distribution ``token_log_probs`` scores (before top-k/top-p). A sampler that
    draws from it has E[log q(y)] = -H(q) exactly, which is what the sampler check tests
    (trainer/rollout/sampling_audit.py). ``entr`` gives 0 for tokens of probability 0, where
    p * log p would be 0 * -inf.
    """
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # [B, V]
    return torch.special.entr(probs).sum(dim=-1)  # [B]


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The most likely token of each row (the first one on ties), [B, V] -> [B]."""
    return torch.argmax(logits, dim=-1)


def nonfinite_rows_mask(logits: torch.Tensor) -> torch.Tensor:
    """[B] bool, on the logits' device: rows whose softmax would not be a distribution.

    That is a NaN or +inf anywhere in the row, or every entry -inf (-inf alone is fine: it is how
    filters remove tokens). No host read, so it can run inside a captured decode step.
    """
    return torch.isnan(logits).any(dim=-1) | torch.isposinf(logits).any(dim=-1) | torch.isneginf(logits).all(dim=-1)


def nonfinite_rows(logits: torch.Tensor) -> list[int]:
    """Indices of the rows flagged by ``nonfinite_rows_mask`` (a host read)."""
    return torch.nonzero(nonfinite_rows_mask(logits)).flatten().tolist()
