"""A seeded synthetic math data set: arithmetic word problems with exact integer answers.

It is the default data set when none is given: nothing can be downloaded, and a benchmark needs
prompts whose answers a rule-based reward can check. Rows follow VERL's RL schema (schema.py) with
data_source "rlbench/synthetic_math"; the prompt asks for the final answer after "####" (as
VERL's GSM8K preparation does) or inside \\boxed{}.

Determinism: the same (n, seed, split, difficulty) gives the same rows, on any machine and Python
version. Only ``random.Random.random()`` is used, the one method whose stream Python promises to keep.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.data.chat_template import template_prompts
from trainer.data.schema import write_rows

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

DATA_SOURCE = "rlbench/synthetic_math"
ABILITY = "math"
# Short on purpose: with a character-level tokenizer every character is a token, and the standard
# set's templated prompts must fit the default max_prompt_length of 128.
INSTRUCTION = 'Give the answer after "####".'
SHORT_INSTRUCTION = 'Answer after "####".'

_PEOPLE: tuple[tuple[str, str], ...] = (
    ("Tom", "he"),
    ("Anna", "she"),
    ("Ravi", "he"),
    ("Mei", "she"),
    ("Omar", "he"),
    ("Lena", "she"),
    ("Kofi", "he"),
    ("Sara", "she"),
)
_ITEMS: tuple[str, ...] = ("apple", "pen", "marble", "card", "book", "coin", "cookie", "stamp")


def _count(number: int, item: str) -> str:
    return f"{number} {item}" if number == 1 else f"{number} {item}s"


class _Rng:
    """Integers from ``random.Random.random()`` alone, so the stream cannot change under us."""

    def __init__(self, seed: str) -> None:
        self._r = random.Random(seed)  # str seeds go through sha512: stable, unaffected by PYTHONHASHSEED

    def integer(self, low: int, high: int) -> int:
        """Uniform integer in [low, high]."""
        if high < low:
            raise ValueError(f"empty range [{low}, {high}]")
        return low + min(int(self._r.random() * (high - low + 1)), high - low)

    def choice(self, options: tuple[Any, ...]) -> Any:
        return options[self.integer(0, len(options) - 1)]


@dataclass(frozen=True)
class Problem:
    """One generated problem: the question text, the worked answer and the final integer."""

    question: str
    solution: str
    answer: int


# A template draws its numbers with (rng, max_operand, max_answer) and returns a Problem.
Template = Callable[[_Rng, int, int], Problem]


def _add(rng: _Rng, max_operand: int, max_answer: int) -> Problem:
    name, pron = rng.choice(_PEOPLE)
    item = rng.choice(_ITEMS)
    a = rng.integer(0, min(max_operand, max_answer - 1))
    b = rng.integer(1, min(max_operand, max_answer - a))
    q = f"{name} has {_count(a, item)} and buys {b} more. How many {item}s does {pron} have?"
    return Problem(q, f"{a} + {b} = {a + b}", a + b)


def _subtract(rng: _Rng, max_operand: int, max_answer: int) -> Problem:
    name, _ = rng.choice(_PEOPLE)
    item = rng.choice(_ITEMS)
    a = rng.integer(0, max_operand)
    b = rng.integer(max(0, a - max_answer), a)  # a - b stays within [0, max_answer]
    q = f"{name} has {_count(a, item)} and gives {b} away. How many {item}s are left?"
    return Problem(q, f"{a} - {b} = {a - b}", a - b)


def _multiply(rng: _Rng, max_operand: int, max_answer: int) -> Problem:
    name, _ = rng.choice(_PEOPLE)
    item = rng.choice(_ITEMS)
    a = rng.integer(1, min(max_operand, max_answer))
    b = rng.integer(1, min(max_operand, max_answer // a))
    q = f"{name} buys {_count(a, 'bag')} of {_count(b, item)}. How many {item}s is that?"
    return Problem(q, f"{a} * {b} = {a * b}", a * b)


def _divide(rng: _Rng, max_operand: int, max_answer: int) -> Problem:
    name, _ = rng.choice(_PEOPLE)
    item = rng.choice(_ITEMS)
    friends = rng.integer(1, max(1, max_operand))
    each = rng.integer(1, min(max_operand, max_answer))
    total = friends * each  # built from the quotient, so the division is exact
    q = f"{name} shares {_count(total, item)} equally among {_count(friends, 'friend')}. How many does each get?"
    return Problem(q, f"{total} / {friends} = {each}", each)


def _two_step(rng: _Rng, max_operand: int, max_answer: int) -> Problem:
    name, _ = rng.choice(_PEOPLE)
    item = rng.choice(_ITEMS)
    a = rng.integer(0, max_operand)
    b = rng.integer(0, max_operand)
    c = rng.integer(max(0, a + b - max_answer), a + b)  # the answer stays within [0, max_answer]
    q = f"{name} has {_count(a, item)}, buys {b} more, then gives {c} away. How many are left?"
    return Problem(q, f"{a} + {b} = {a + b}\n{a + b} - {c} = {a + b - c}", a + b - c)


def _bare_add(rng: _Rng, max_operand: int, max_answer: int) -> Problem:
    a = rng.integer(0, min(max_operand, max_answer))
    b = rng.integer(0, min(max_operand, max_answer - a))
    return Problem(f"What is {a} + {b}?", f"{a} + {b} = {a + b}", a + b)


def _bare_subtract(rng: _Rng, max_operand: int, max_answer: int) -> Problem:
    a = rng.integer(0, max_operand)
    b = rng.integer(max(0, a - max_answer), a)
    return Problem(f"What is {a} - {b}?", f"{a} - {b} = {a - b}", a - b)


TEMPLATES: dict[str, Template] = {
    "add": _add,
    "subtract": _subtract,
    "multiply": _multiply,
    "divide": _divide,
    "two_step": _two_step,
    "bare_add": _bare_add,
    "bare_subtract": _bare_subtract,
}


@dataclass(frozen=True)
class Difficulty:
    """Which templates, how large the numbers, and the instruction appended to each question.

    Operands are at most ``max_operand``; answers lie in [0, max_answer] (max_answer 9: one digit)."""

    templates: tuple[str, ...]
    max_operand: int
    max_answer: int
    instruction: str = INSTRUCTION

    def __post_init__(self) -> None:
        unknown = [t for t in self.templates if t not in TEMPLATES]
        if not self.templates or unknown:
            raise ValueError(
                f"templates: expected a non-empty subset of {sorted(TEMPLATES)}, found {list(self.templates)}"
            )
        if self.max_operand < 1 or self.max_answer < 1:
            raise ValueError(
                f"expected max_operand >= 1 and max_answer >= 1, found {self.max_operand} and {self.max_answer}"
            )


DIFFICULTIES: dict[str, Difficulty] = {
    # For learning tests on a tiny model: short prompts, one-digit answers.
    "tiny": Difficulty(
        ("bare_add", "bare_subtract"), max_operand=9, max_answer=9, instruction=SHORT_INSTRUCTION
    ),
    "easy": Difficulty(("add", "subtract"), max_operand=9, max_answer=9),
    "standard": Difficulty(
        ("add", "subtract", "multiply", "divide", "two_step"), max_operand=20, max_answer=400
    ),
    "hard": Difficulty(
        ("add", "subtract", "multiply", "divide", "two_step"), max_operand=100, max_answer=10_000
    ),
}


def _resolve(difficulty: str | Difficulty) -> Difficulty:
    if isinstance(difficulty, Difficulty):
        return difficulty
    if difficulty not in DIFFICULTIES:
        raise ValueError(
            f"difficulty: expected one of {sorted(DIFFICULTIES)} or a Difficulty, found {difficulty!r}"
        )
    return DIFFICULTIES[difficulty]


def make_row(problem: Problem, index: int, split: str, instruction: str = INSTRUCTION) -> dict[str, Any]:
    """One VERL-schema row for a problem; extra_info.answer is the worked solution, GSM8K style."""
    answer = str(problem.answer)
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{problem.question} {instruction}"}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {
            "split": split,
            "index": index,
            "answer": f"{problem.solution}\n#### {answer}",
            "question": problem.question,
        },
    }


def generate_rows(
    n: int,
    seed: int,
    split: str = "train",
    difficulty: str | Difficulty = "standard",
    *,
    max_operand: int | None = None,
    max_answer: int | None = None,
) -> list[dict[str, Any]]:
    """``n`` rows of arithmetic problems; the same arguments give identical rows.

    ``max_operand`` and ``max_answer`` override the difficulty's bounds. Row i depends only on
    (seed, split, difficulty, i), so a longer set extends a shorter one with the same arguments.
    """
    if n < 0:
        raise ValueError(f"n: expected a count >= 0, found {n}")
    level = _resolve(difficulty)
    if max_operand is not None or max_answer is not None:
        level = Difficulty(
            level.templates,
            level.max_operand if max_operand is None else max_operand,
            level.max_answer if max_answer is None else max_answer,
            level.instruction,
        )
    rows = []
    for index in range(n):
        rng = _Rng(f"rlbench-synthetic-math:{seed}:{split}:{index}")
        template = TEMPLATES[rng.choice(level.templates)]
        problem = template(rng, level.max_operand, level.max_answer)
        rows.append(make_row(problem, index, split, level.instruction))
    return rows


# A neutral working instruction, repeated and cut to length, that pads a prompt to a given length.
PREAMBLE = "Work carefully: read the question, write each step of the arithmetic, check it, then answer. "
_PAD_TRIES = 4  # corrections of the filler's length; one suffices with a character-level tokenizer


def _with_filler(row: dict[str, Any], chars: int) -> dict[str, Any]:
    """A copy of ``row`` whose user message starts with ``chars`` characters of PREAMBLE."""
    out = copy.deepcopy(row)
    out["prompt"][0]["content"] = (PREAMBLE * (chars // len(PREAMBLE) + 1))[:chars] + out["prompt"][0]["content"]
    return out


def pad_prompts(
    rows: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, prompt_tokens: int
) -> list[dict[str, Any]]:
    """Copies of ``rows`` whose chat-templated prompts (generation prompt included) are exactly
    ``prompt_tokens`` tokens: a neutral preamble before each question, so every sequence does the
    same prompt work (a baseline's prompt length) without padding tokens.

    The filler's length in characters starts at the missing token count (exact for a character
    tokenizer) and is corrected by the measured difference a few times for other tokenizers."""
    natural = [len(ids) for ids in template_prompts(rows, tokenizer)]
    too_long = [i for i, n in enumerate(natural) if n > prompt_tokens]
    if too_long:
        i = too_long[0]
        raise ValueError(
            f"synthetic prompt_length={prompt_tokens}: expected prompts of at most that many templated tokens, "
            f"found {len(too_long)} longer (row {i} has {natural[i]})"
        )
    chars = [prompt_tokens - n for n in natural]
    out = [_with_filler(r, c) for r, c in zip(rows, chars, strict=True)]
    for attempt in range(_PAD_TRIES + 1):
        lengths = [len(ids) for ids in template_prompts(out, tokenizer)]
        wrong = [i for i, n in enumerate(lengths) if n != prompt_tokens]
        if not wrong or attempt == _PAD_TRIES:
            break
        for i in wrong:
            chars[i] = max(0, chars[i] + prompt_tokens - lengths[i])
            out[i] = _with_filler(rows[i], chars[i])
    if not wrong:
        return out
    raise ValueError(
        f"synthetic prompt_length={prompt_tokens}: expected every templated prompt that long, found "
        f"{len(wrong)} rows off (row {wrong[0]} has {lengths[wrong[0]]} tokens) after {_PAD_TRIES} corrections"
    )


def write_synthetic_parquet(
    path: str | Path,
    n: int,
    seed: int,
    split: str = "train",
    difficulty: str | Difficulty = "standard",
    *,
    prompt_length: int = 0,
    tokenizer: PreTrainedTokenizerBase | None = None,
    **bounds: int | None,
) -> Path:
    """Write ``generate_rows(n, seed, split, difficulty, **bounds)`` (bounds: its ``max_operand`` and
    ``max_answer``) as a VERL-schema parquet file and return its path; with ``prompt_length`` > 0
    each prompt is padded to that many templated tokens of ``tokenizer`` (``pad_prompts``)."""
    rows = generate_rows(n, seed, split, difficulty, **bounds)
    if prompt_length > 0:
        if tokenizer is None:
            raise ValueError(f"prompt_length={prompt_length} needs the tokenizer that templates the prompts, got None")
        rows = pad_prompts(rows, tokenizer, prompt_length)
    return write_rows(rows, path)


__all__ = [
    "ABILITY",
    "DATA_SOURCE",
    "DIFFICULTIES",
    "Difficulty",
    "INSTRUCTION",
    "PREAMBLE",
    "TEMPLATES",
    "generate_rows",
    "make_row",
    "pad_prompts",
    "write_synthetic_parquet",
]
