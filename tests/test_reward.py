"""Rule-based math reward: extraction, normalisation, numeric comparison, token-level placement."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.driver.reward import (
    _NUMBER_RE,
    ExtractedAnswer,
    answers_match,
    compute_score,
    extract_answer,
    last_boxed,
    last_number,
    normalize_answer,
    parse_number,
    score_batch,
    scores_to_token_rewards,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("first \\boxed{3}, then \\boxed{4}", "4"),
        ("\\boxed{{a}+{b}}", "{a}+{b}"),
        ("\\fbox{7}", "7"),
        ("$\\boxed 5$", "5"),
        # an unclosed last box (truncated response) falls back to the earlier closed one
        ("\\boxed{1} and then \\boxed{2", "1"),
        ("no box here", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    ("response", "text", "source"),
    [
        ("#### 5 ... \\boxed{7}", "7", "boxed"),  # boxed wins over ####
        ("steps\n#### 1,000\nthanks", "1,000", "hash"),
        ("#### 3\n#### 4", "4", "hash"),  # the last marker
        ("I get 3 apples, then 12 more: 15.", "15", "number"),
        ("The total is -3.", "-3", "number"),
        ("answer 1/2", "1/2", "number"),
        ("cost 2.50 dollars", "2.50", "number"),
        ("about 1,000,000 people", "1,000,000", "number"),
        ("nothing numeric", None, None),
    ],
)
def test_extract_answer(response: str, text: str | None, source: str | None) -> None:
    got = extract_answer(response)
    assert (got.text, got.source) == (text, source)


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("1,000", "1000"),
        ("$ 2.50 .", "2.50"),
        ("\\$18", "18"),
        ("\\frac{3}{4}", "3/4"),
        ("-\\dfrac{1}{2}", "-1/2"),
        ("\\frac12", "1/2"),
        ("\\text{12}", "12"),
        ("50\\%", "50"),
        ("\\left( x \\right)", "(x)"),
    ],
)
def test_normalize(raw: str, normal: str) -> None:
    assert normalize_answer(raw) == normal


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("-3", -3.0),
        ("2.50", 2.5),
        ("1/2", 0.5),
        ("-1/4", -0.25),
        ("1.5/3", 0.5),
        ("1e3", 1000.0),
        ("1/0", None),
        ("x+1", None),
        ("", None),
    ],
)
def test_parse_number(text: str, value: float | None) -> None:
    assert parse_number(text) == value


@pytest.mark.parametrize(
    ("answer", "truth", "match"),
    [
        ("1,000", "1000", True),
        ("2.50", "2.5", True),
        ("1/2", "0.5", True),
        ("\\frac{1}{2}", "1/2", True),
        ("-3", "-3", True),
        ("-3", "3", False),
        ("x = 5", "5", True),
        # relative tolerance 1e-6: 0.3333333 vs 1/3 differs by 1e-7 relative; 0.333 by 1e-3
        ("0.3333333", "1/3", True),
        ("0.333", "1/3", False),
        ("1000001", "1000000", True),  # 1e-6 relative
        ("1000002", "1000000", False),
        ("x + 1", "x+1", True),  # not numbers: normalised text
        ("x+2", "x+1", False),
        ("", "", False),
    ],
)
def test_answers_match(answer: str, truth: str, match: bool) -> None:
    assert answers_match(answer, truth) is match


def test_compute_score() -> None:
    assert compute_score("so the answer is \\boxed{1,000}", "1000") == 1.0
    assert compute_score("#### 72", "72") == 1.0
    assert compute_score("I think it is 2.50.", "2.5") == 1.0
    assert compute_score("\\boxed{71}", "72") == 0.0
    assert compute_score("", "72") == 0.0
    # format-only partial credit is off by default and only for an explicit format
    assert compute_score("\\boxed{71}", "72", format_score=0.1) == 0.1
    assert compute_score("#### 71", "72", format_score=0.1) == 0.1
    assert compute_score("maybe 71", "72", format_score=0.1) == 0.0
    assert compute_score("no answer", "72", format_score=0.1) == 0.0


def test_score_batch() -> None:
    responses = ["\\boxed{3}", "#### 4", "5", "six"]
    assert score_batch(responses, ["3", "5", "5", "6"]) == [1.0, 0.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="got 4 responses and 3 ground truths"):
        score_batch(responses, ["3", "5", "5"])


def test_scores_to_token_rewards() -> None:
    mask = torch.tensor(
        [
            [1, 1, 1, 0],  # last response token at 2
            [1, 0, 0, 0],  # at 0
            [0, 0, 0, 0],  # empty response: no token to carry the score
            [0, 1, 1, 0],  # not starting at 0: still the last valid position, 2
            [1, 1, 1, 1],  # full length: 3
        ]
    )
    rewards = scores_to_token_rewards([1.0, 0.5, 1.0, 2.0, -1.0], mask)
    expected = torch.zeros(5, 4)
    expected[0, 2], expected[1, 0], expected[3, 2], expected[4, 3] = 1.0, 0.5, 2.0, -1.0
    assert torch.equal(rewards, expected)
    assert rewards.dtype == torch.float32
    # sum over tokens gives back the score (0 for the empty response)
    assert rewards.sum(-1).tolist() == [1.0, 0.5, 0.0, 2.0, -1.0]


def test_scores_to_token_rewards_errors() -> None:
    with pytest.raises(ValueError, match="got 2 scores for 3 responses"):
        scores_to_token_rewards([1.0, 0.0], torch.ones(3, 2))
    with pytest.raises(ValueError, match=r"response_mask must be \[B, T\]"):
        scores_to_token_rewards([1.0], torch.ones(3))


# The last number, found from the end: the same as the last of a scan of the whole text, whatever the
# window, on texts made of what numbers are made of and a few characters that break them.
@settings(max_examples=400, deadline=None)
@given(
    text=st.text(alphabet="0123456789,.-/ \nab\u0663", max_size=300),
    window=st.integers(min_value=1, max_value=40),
)
def test_last_number_from_the_end_is_the_last_of_all(text: str, window: int) -> None:
    numbers = _NUMBER_RE.findall(text)
    assert last_number(text, window) == (numbers[-1] if numbers else None), (text, window)


def test_a_long_response_without_a_boxed_answer_gives_its_last_number() -> None:
    # Numbers that run together across the window's edge: the answer is the whole last one.
    text = "x " * 5000 + "the total is 1,234,567 / 89 and then words " + "y" * 3000 + " 42.5"
    assert extract_answer(text) == ExtractedAnswer("42.5", "number")
    assert last_number("z" * 5000 + " 10 / 3" + " q" * 2000) == "10 / 3"
    assert last_number("9" * 3000) == "9" * 3000  # no character breaks it: the whole text is scanned
