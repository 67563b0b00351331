"""trainer.rollout.sampling against hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.rollout.sampling import (
    apply_temperature,
    greedy,
    nonfinite_rows,
    nonfinite_rows_mask,
    process_logits,
    sample,
    top_k_filter,
    top_p_filter,
)

NEG_INF = float("-inf")
PROBS = [0.5, 0.3, 0.15, 0.05]


def logits_of(probs: list[float]) -> torch.Tensor:
    return torch.tensor([[math.log(p) for p in probs]])


def kept(logits: torch.Tensor) -> list[int]:
    return torch.nonzero(torch.isfinite(logits[0])).flatten().tolist()


def seeded(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


# ----------------------------------------------------------------------------- temperature
def test_temperature_divides_logits():
    out = apply_temperature(torch.tensor([[2.0, 4.0, -6.0]]), 2.0)
    assert out.tolist() == [[1.0, 2.0, -3.0]]


def test_temperature_one_is_identity_and_low_temperature_sharpens():
    logits = logits_of(PROBS)
    assert apply_temperature(logits, 1.0) is logits
    p_cold = torch.softmax(apply_temperature(logits, 0.5), dim=-1)[0]
    p_hot = torch.softmax(apply_temperature(logits, 2.0), dim=-1)[0]
    # T = 0.5 squares the probabilities before renormalising: 0.25 / (0.25 + 0.09 + 0.0225 + 0.0025)
    assert p_cold[0].item() == pytest.approx(0.25 / 0.365, rel=1e-5)
    assert p_hot[0] < 0.5 < p_cold[0]


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_temperature_must_be_positive(bad):
    with pytest.raises(ValueError, match="temperature must be > 0"):
        apply_temperature(torch.zeros(1, 3), bad)


# ----------------------------------------------------------------------------- top-k
def test_top_k_keeps_the_k_largest():
    out = top_k_filter(torch.tensor([[1.0, 3.0, 2.0, 0.0]]), 2)
    assert out.tolist() == [[NEG_INF, 3.0, 2.0, NEG_INF]]


@pytest.mark.parametrize("k", [0, -1, 4, 10])
def test_top_k_off_or_wider_than_vocab_is_identity(k):
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    assert torch.equal(top_k_filter(logits, k), logits)


def test_top_k_one_leaves_only_the_argmax_per_row():
    logits = torch.tensor([[0.1, 0.9, 0.3], [2.0, -1.0, 1.0]])
    out = top_k_filter(logits, 1)
    assert torch.isfinite(out).sum(dim=1).tolist() == [1, 1]
    assert greedy(out).tolist() == greedy(logits).tolist() == [1, 0]


def test_top_k_keeps_ties_with_the_kth_value():
    out = top_k_filter(torch.tensor([[1.0, 2.0, 2.0, 0.0]]), 1)
    assert kept(out) == [1, 2]


# ----------------------------------------------------------------------------- top-p
@pytest.mark.parametrize(
    "p, expected",
    [
        (0.8, [0, 1]),  # 0.5 + 0.3 reaches 0.8 exactly: the smallest set is the first two
        (0.75, [0, 1]),
        (0.85, [0, 1, 2]),
        (0.4, [0]),  # the top token alone already exceeds p
        (0.01, [0]),  # the top token is always kept
        (0.99, [0, 1, 2, 3]),
        (1.0, [0, 1, 2, 3]),
    ],
)
def test_top_p_keeps_smallest_set_reaching_p(p, expected):
    assert kept(top_p_filter(logits_of(PROBS), p)) == expected


def test_top_p_does_not_depend_on_vocabulary_order():
    order = [2, 0, 3, 1]  # token i has probability PROBS[order[i]]
    out = top_p_filter(logits_of([PROBS[i] for i in order]), 0.8)
    assert kept(out) == [1, 3]  # the tokens holding 0.5 and 0.3


def test_top_p_rows_are_independent_and_kept_logits_unchanged():
    logits = torch.cat([logits_of(PROBS), logits_of([0.05, 0.05, 0.1, 0.8])])
    out = top_p_filter(logits, 0.8)
    assert torch.isfinite(out).tolist() == [[True, True, False, False], [False, False, False, True]]
    assert out[0, 0] == logits[0, 0] and out[1, 3] == logits[1, 3]


@pytest.mark.parametrize("p", [0.0, 1.5])
def test_top_p_out_of_range_is_an_error(p):
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
        top_p_filter(logits_of(PROBS), p)


def test_process_logits_applies_temperature_before_top_p():
    # At T = 0.5 the top token has probability 0.685 >= 0.6, so top-p keeps it alone;
    # without the temperature it would keep two (0.5 < 0.6).
    assert kept(process_logits(logits_of(PROBS), 0.5, 0, 0.6)) == [0]
    assert kept(process_logits(logits_of(PROBS), 1.0, 0, 0.6)) == [0, 1]
    assert kept(process_logits(logits_of(PROBS), 1.0, 3, 0.99)) == [0, 1, 2]


# ----------------------------------------------------------------------------- sampling
def test_sample_is_reproducible_with_a_seeded_generator():
    logits = torch.randn(64, 50, generator=seeded(0))
    a = sample(logits, seeded(7))
    b = sample(logits, seeded(7))
    c = sample(logits, seeded(8))
    assert a.shape == (64,) and a.dtype == torch.long
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_sample_frequencies_match_the_distribution():
    draws = 20000
    logits = logits_of(PROBS).expand(draws, -1)
    counts = torch.bincount(sample(logits, seeded(0)), minlength=4).double() / draws
    # binomial standard error is at most 0.0035 at 20000 draws; 0.015 is over 4 of them
    assert counts.tolist() == pytest.approx(PROBS, abs=0.015)


def test_sample_never_picks_filtered_tokens():
    logits = top_k_filter(torch.randn(2000, 30, generator=seeded(1)), 3)
    tokens = sample(logits, seeded(2))
    assert torch.isfinite(logits.gather(1, tokens[:, None])).all()


def test_sample_with_top_k_one_equals_greedy():
    logits = torch.randn(200, 40, generator=seeded(3))
    assert torch.equal(sample(top_k_filter(logits, 1), seeded(4)), greedy(logits))


def test_sample_does_not_raise_on_nan_rows():
    # Unlike torch.multinomial, which asserts on a GPU; the engines check finiteness separately.
    logits = torch.tensor([[0.0, float("nan"), 1.0], [0.0, 1.0, 2.0]])
    tokens = sample(logits, seeded(0))
    assert tokens.shape == (2,) and 0 <= int(tokens[0]) < 3


# ----------------------------------------------------------------------------- finiteness
def test_nonfinite_rows_flags_nan_posinf_and_all_neginf():
    nan, inf = float("nan"), float("inf")
    logits = torch.tensor(
        [
            [0.0, 1.0, 2.0],
            [nan, 0.0, 0.0],
            [inf, 0.0, 0.0],
            [NEG_INF, NEG_INF, NEG_INF],
            [NEG_INF, 0.0, NEG_INF],  # filtered tokens are fine while one survives
        ]
    )
    assert nonfinite_rows(logits) == [1, 2, 3]
    assert nonfinite_rows_mask(logits).tolist() == [False, True, True, True, False]
    assert nonfinite_rows(torch.zeros(4, 3)) == []


# --- keyed sampling: a row's draw does not depend on its batch -----------------------------------
def test_keyed_noise_depends_only_on_seed_row_step_and_token():
    from trainer.rollout.sampling import keyed_exponential

    keys = torch.tensor([5, 9, 12])
    full = keyed_exponential(keys, 3, 50, seed=7)
    alone = keyed_exponential(torch.tensor([9]), 3, 50, seed=7)
    assert torch.equal(full[1], alone[0])  # row 9 draws the same noise alone or in a batch
    assert not torch.equal(full, keyed_exponential(keys, 4, 50, seed=7))  # next step differs
    assert not torch.equal(full, keyed_exponential(keys, 3, 50, seed=8))  # another seed differs
    assert not torch.equal(full[0], full[1])  # rows differ


def test_keyed_noise_is_exponential():
    from trainer.rollout.sampling import keyed_exponential

    e = keyed_exponential(torch.arange(200), 0, 1000, seed=1).double()
    # Exp(1): mean 1, variance 1, P(E > 1) = e^-1; 200k draws put each within a few 1e-2.
    assert abs(e.mean().item() - 1.0) < 0.02
    assert abs(e.var().item() - 1.0) < 0.05
    assert abs((e > 1).double().mean().item() - math.exp(-1)) < 0.01
    assert e.min() > 0 and torch.isfinite(e).all()


def test_hash_to_uniform_stays_strictly_inside_zero_and_one():
    from trainer.rollout.sampling import hash_to_uniform

    # the extreme hashes: with 24 bits, 0xFFFFFFFF became u = 1.0, an Exp(1) draw of 0 that won the race
    h = torch.tensor([0, 1, 0xFF, 0xFFFFFEFF, 0xFFFFFFFF], dtype=torch.long)
    u = hash_to_uniform(h)
    assert u.dtype == torch.float32
    assert (u > 0).all() and (u < 1).all()
    assert (-torch.log(u) > 0).all()
    # equally spaced by 2**-23 and exact: (k + 0.5) / 2**23
    k = torch.tensor([0, (1 << 23) - 1])
    assert hash_to_uniform(k << 9).tolist() == [0.5 / (1 << 23), ((1 << 23) - 0.5) / (1 << 23)]


def test_sample_keyed_follows_the_distribution():
    from trainer.rollout.sampling import sample_keyed

    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = probs.log().expand(20000, 3)
    tokens = sample_keyed(logits, torch.arange(20000), 0, seed=3)
    freq = torch.bincount(tokens, minlength=3).double() / 20000
    assert torch.allclose(freq, probs.double(), atol=0.015)
