"""Rule-based math reward: extract the final answer, compare it with the ground truth numerically.

Answer extraction, in order of preference:
  1. the content of the last ``\\boxed{...}`` (nested braces handled; also ``\\fbox`` and ``\\boxed 5``),
  2. else the text after the last ``####`` (GSM8K style),
  3. else the last number in the text.
The answer and the ground truth are normalised (commas, ``$``, spaces, a trailing period, ``\\frac``,
``\\text{}``, ``\\left``/``\\right``, a trailing ``%``) and compared as numbers with relative tolerance
1e-6 (``1,000`` = ``1000``, ``2.50`` = ``2.5``, ``1/2`` = ``0.5``); when either side is not a
number, the normalised strings must be equal.

Score: 1.0 when correct; otherwise ``format_score`` (0.0 by default) when an answer was given in an
explicit format (boxed or ####), else 0.0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import torch

REL_TOL = 1e-6

# A number in free text: sign, thousands groups or plain digits, decimals, an optional "/ d" fraction;
# not glued to a preceding letter or digit ("x2", "v1.5" are not answers).
_NUMBER_RE = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|(?<![\w.])-?\.\d+")
# A character that no _NUMBER_RE match holds: not a digit, separator, sign, slash or space (a match
# holds spaces only around a fraction's slash).
_NOT_IN_A_NUMBER = re.compile(r"[^\d,.\-/\s]")
_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_FRAC_SHORT_RE = re.compile(r"\\[dt]?frac(\d)(\d)")
_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")


@dataclass(frozen=True)
class ExtractedAnswer:
    """The answer text and where it came from: "boxed", "hash", "number" (or None if nothing)."""

    text: str | None
    source: str | None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` with nested braces, or ``\\boxed x``.

    Returns None when there is none or its braces never close (a truncated response).
    """
    starts = list(re.finditer(r"\\(?:boxed|fbox)", text))
    for m in reversed(starts):
        i = m.end()
        # "\boxed 5" form: a space, then the token up to whitespace or "$".
        if i < len(text) and text[i] == " ":
            rest = re.match(r"\s+([^\s$]+)", text[i:])
            if rest:
                return rest.group(1)
            continue
        while i < len(text) and text[i] in " \t":
            i += 1
        if i >= len(text) or text[i] != "{":
            continue
        depth = 0
        for j in range(i, len(text)):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    return text[i + 1 : j]
        # Unclosed braces: look at an earlier \boxed instead.
    return None


def extract_answer(response: str) -> ExtractedAnswer:
    """The final answer of ``response``: last \\boxed{}, else after last ####, else the last number."""
    boxed = last_boxed(response)
    if boxed is not None:
        return ExtractedAnswer(boxed, "boxed")
    if "####" in response:
        tail = response.rsplit("####", 1)[1].strip()
        if tail:
            # The answer is the first line after the marker.
            return ExtractedAnswer(tail.splitlines()[0].strip(), "hash")
    number = last_number(response)
    if number is not None:
        return ExtractedAnswer(number, "number")
    return ExtractedAnswer(None, None)


def last_number(text: str, window: int = 1024) -> str | None:
    """``_NUMBER_RE.findall(text)[-1]`` (None if there is none), found from the end of the text.

    A response cut off at the length cap has no boxed answer, and scanning all of it for numbers took
    most of the reward (about 1 s for 256 rows of 35k characters). So: in the last ``window``
    characters take the first character no number can hold (``_NOT_IN_A_NUMBER``). No match of the
    whole text contains it, so the whole text's matches after it are those of a scan that starts just
    after it (the look-behind still sees it). The last of those is the answer; where there is none,
    the window grows, up to the whole text."""
    while len(text) > window:
        breaker = _NOT_IN_A_NUMBER.search(text, len(text) - window)
        after = _NUMBER_RE.findall(text, breaker.end()) if breaker is not None else []
        if after:
            return after[-1]
        window *= 16
    numbers = _NUMBER_RE.findall(text)
    return numbers[-1] if numbers else None


def normalize_answer(answer: str) -> str:
    """Canonical text of an answer: LaTeX wrappers off, commas, $, spaces, trailing period removed."""
    s = answer.strip()
    for _ in range(3):  # unwrap nested \text{\frac{..}{..}} and the like
        s = _TEXT_RE.sub(r"\1", s)
        s = _FRAC_RE.sub(r"(\1)/(\2)", s)
        s = _FRAC_SHORT_RE.sub(r"\1/\2", s)
    for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\$", "$", "^\\circ", "^{\\circ}", "\\%"):
        s = s.replace(token, "")
    s = s.replace(" ", "").replace(",", "")
    s = s.rstrip(".")
    s = s.removesuffix("%")
    # "(3)/(4)" from \frac -> "3/4" when both parts are plain numbers.
    s = re.sub(r"^(-?)\((-?[\d.]+)\)/\((-?[\d.]+)\)$", r"\1\2/\3", s)
    if s.startswith("{") and s.endswith("}"):
        s = s[1:-1]
    return s


def parse_number(text: str) -> float | None:
    """The value of a normalised answer ("-3", "2.50", "1/2", "1e3"), or None if it is not a number."""
    if not text:
        return None
    num, _, den = text.partition("/")
    try:
        value = Fraction(num)
        if den:
            # Fraction("1.5/2") is refused, so the two parts are parsed apart.
            value = value / Fraction(den)
    except (ValueError, ZeroDivisionError):
        return None
    return float(value)


def answers_match(answer: str, ground_truth: str, rel_tol: float = REL_TOL) -> bool:
    """True when the two answers are the same number (within ``rel_tol``) or the same normalised text."""
    a, g = normalize_answer(answer), normalize_answer(ground_truth)
    va, vg = parse_number(a), parse_number(g)
    if va is None and vg is not None and "=" in a:
        # "x=5" answers the number 5.
        va = parse_number(a.rsplit("=", 1)[1])
    if va is not None and vg is not None:
        return math.isclose(va, vg, rel_tol=rel_tol, abs_tol=0.0)
    return a == g and a != ""


def compute_score(response: str, ground_truth: str, format_score: float = 0.0, score: float = 1.0) -> float:
    """``score`` if the response's final answer equals ``ground_truth``, else ``format_score`` for a
    boxed or #### answer, else 0.0."""
    extracted = extract_answer(response)
    if extracted.text is None:
        return 0.0
    if answers_match(extracted.text, ground_truth):
        return score
    return format_score if extracted.source in ("boxed", "hash") else 0.0


def score_batch(
    responses: Sequence[str], ground_truths: Sequence[str], format_score: float = 0.0
) -> list[float]:
    """compute_score for each (response, ground truth) pair."""
    if len(responses) != len(ground_truths):
        raise ValueError(
            f"score_batch needs one ground truth per response; got {len(responses)} responses "
            f"and {len(ground_truths)} ground truths"
        )
    return [
        compute_score(r, g, format_score=format_score) for r, g in zip(responses, ground_truths, strict=True)
    ]


def scores_to_token_rewards(
    scores: torch.Tensor | Sequence[float], response_mask: torch.Tensor
) -> torch.Tensor:
    """Token-level rewards [B, T]: the sequence's score on its last response token, 0 elsewhere.

    The last response token is the last position where ``response_mask`` is 1 (the EOS, when the
    response ended). An empty response (mask all 0) has no token to carry the score: its row is all
    zero, so every estimator sees s_i = 0 for it (VERL would write to position -1 instead).
    """
    if response_mask.dim() != 2:
        raise ValueError(f"response_mask must be [B, T]; got shape {tuple(response_mask.shape)}")
    s = torch.as_tensor(scores, dtype=torch.float32, device=response_mask.device).reshape(-1)
    b, t = response_mask.shape
    if s.shape[0] != b:
        raise ValueError(f"got {s.shape[0]} scores for {b} responses")
    valid = response_mask > 0
    rewards = torch.zeros(b, t, dtype=torch.float32, device=response_mask.device)
    if t == 0:
        return rewards
    # Index of the last valid position: argmax over position-weighted mask (ties impossible).
    positions = torch.arange(1, t + 1, device=response_mask.device).expand(b, t)
    last = torch.where(valid, positions, torch.zeros_like(positions)).argmax(dim=-1)
    has_any = valid.any(dim=-1)
    rewards[torch.arange(b, device=rewards.device), last] = torch.where(has_any, s, torch.zeros_like(s))
    return rewards
