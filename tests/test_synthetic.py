"""The synthetic math generator: deterministic, VERL-schema rows, answers that are right."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from trainer.data.synthetic import (
    DATA_SOURCE,
    DIFFICULTIES,
    PREAMBLE,
    TEMPLATES,
    Difficulty,
    generate_rows,
    pad_prompts,
    write_synthetic_parquet,
)
from trainer.data.validate import read_valid_rows, validate_rows

# Each template's question, parsed back independently of the generator, and its answer.
PARSERS: list[tuple[re.Pattern[str], object]] = [
    (re.compile(r"has (\d+) \w+, buys (\d+) more, then gives (\d+) away"), lambda a, b, c: a + b - c),
    (re.compile(r"has (\d+) \w+ and buys (\d+) more"), lambda a, b: a + b),
    (re.compile(r"has (\d+) \w+ and gives (\d+) away"), lambda a, b: a - b),
    (re.compile(r"buys (\d+) bags? of (\d+) \w+\."), lambda a, b: a * b),
    (
        re.compile(r"shares (\d+) \w+ equally among (\d+) friends?"),
        lambda t, f: t // f if t % f == 0 else None,
    ),
    (re.compile(r"^What is (\d+) \+ (\d+)\?$"), lambda a, b: a + b),
    (re.compile(r"^What is (\d+) - (\d+)\?$"), lambda a, b: a - b),
]


def solve(question: str) -> int:
    for pattern, fn in PARSERS:
        m = pattern.search(question)
        if m:
            return fn(*map(int, m.groups()))  # type: ignore[operator]
    raise AssertionError(f"no parser for {question!r}")


def test_same_seed_same_rows_other_seed_other_rows() -> None:
    assert generate_rows(50, seed=7) == generate_rows(50, seed=7)
    assert generate_rows(50, seed=7) != generate_rows(50, seed=8)
    assert generate_rows(50, seed=7, split="train") != generate_rows(50, seed=7, split="test")


def test_a_longer_set_extends_a_shorter_one() -> None:
    assert generate_rows(30, seed=3)[:10] == generate_rows(10, seed=3)


def test_pinned_first_row() -> None:
    # Guards the promise that a seed means the same data on any machine and Python version.
    row = generate_rows(1, seed=0)[0]
    assert (
        row["extra_info"]["question"]
        == "Omar shares 39 cards equally among 3 friends. How many does each get?"
    )
    assert row["reward_model"] == {"style": "rule", "ground_truth": "13"}


def test_written_files_are_byte_identical(tmp_path: Path) -> None:
    a = write_synthetic_parquet(tmp_path / "a.parquet", 64, seed=11)
    b = write_synthetic_parquet(tmp_path / "b" / "b.parquet", 64, seed=11)
    assert a.read_bytes() == b.read_bytes()
    assert read_valid_rows(a) == generate_rows(64, seed=11)


@pytest.mark.parametrize("difficulty", sorted(DIFFICULTIES))
def test_rows_fit_the_schema_and_answers_are_right(difficulty: str) -> None:
    rows = generate_rows(300, seed=1, split="test", difficulty=difficulty)
    assert validate_rows(rows) == []
    for i, row in enumerate(rows):
        truth = row["reward_model"]["ground_truth"]
        info = row["extra_info"]
        assert row["data_source"] == DATA_SOURCE and row["ability"] == "math"
        assert row["reward_model"]["style"] == "rule"
        assert info["split"] == "test" and info["index"] == i
        assert solve(info["question"]) == int(truth), info["question"]
        assert info["answer"].endswith(f"#### {truth}")
        [message] = row["prompt"]
        assert message["role"] == "user"
        assert message["content"].startswith(info["question"]) and "####" in message["content"]


def test_tiny_and_easy_have_single_digit_answers() -> None:
    for difficulty in ("tiny", "easy"):
        answers = {
            int(r["reward_model"]["ground_truth"]) for r in generate_rows(500, seed=2, difficulty=difficulty)
        }
        assert answers <= set(range(10))
        assert len(answers) >= 8  # not degenerate


def test_standard_uses_every_word_template() -> None:
    questions = [r["extra_info"]["question"] for r in generate_rows(200, seed=5)]
    kinds = Counter(next(i for i, (p, _) in enumerate(PARSERS) if p.search(q)) for q in questions)
    assert set(kinds) == {0, 1, 2, 3, 4}


def test_max_operand_and_max_answer_overrides() -> None:
    rows = generate_rows(300, seed=4, difficulty="easy", max_operand=3)
    numbers = [int(n) for r in rows for n in re.findall(r"\d+", r["extra_info"]["question"])]
    assert max(numbers) <= 3
    rows = generate_rows(300, seed=4, difficulty="standard", max_answer=5)
    assert max(int(r["reward_model"]["ground_truth"]) for r in rows) <= 5


def test_custom_difficulty() -> None:
    level = Difficulty(("multiply",), max_operand=4, max_answer=16, instruction="Answer after ####.")
    rows = generate_rows(100, seed=0, difficulty=level)
    assert all(r["prompt"][0]["content"].endswith("Answer after ####.") for r in rows)
    assert all(" bag" in r["extra_info"]["question"] for r in rows)
    assert max(int(r["reward_model"]["ground_truth"]) for r in rows) <= 16


def test_bad_arguments_say_what_was_expected() -> None:
    with pytest.raises(
        ValueError, match=r"difficulty: expected one of \['easy', 'hard', 'standard', 'tiny'\].*'brutal'"
    ):
        generate_rows(1, seed=0, difficulty="brutal")
    with pytest.raises(ValueError, match="n: expected a count >= 0, found -1"):
        generate_rows(-1, seed=0)
    with pytest.raises(ValueError, match="templates: expected a non-empty subset"):
        Difficulty(("add", "power"), max_operand=3, max_answer=9)
    with pytest.raises(ValueError, match="max_operand >= 1"):
        generate_rows(1, seed=0, max_operand=0)
    assert set(TEMPLATES) >= {"add", "subtract", "multiply", "divide", "two_step"}


# ----------------------------------------------------------------------------- padded prompts
def test_synthetic_prompt_length_gives_templated_prompts_of_exactly_that_length(tmp_path: Path) -> None:
    from trainer.config import build_config
    from trainer.data.source import load_train_dataset
    from trainer.models.presets import load_tokenizer

    tokenizer = load_tokenizer("tiny")
    overrides = ["data.synthetic_size=24", "data.max_prompt_length=200"]
    natural = load_train_dataset(build_config(overrides).data, tokenizer, tmp_path)
    assert len({len(p.input_ids) for p in natural.prompts}) > 1
    cfg = build_config([*overrides, "data.synthetic_prompt_length=150"])
    padded = load_train_dataset(cfg.data, tokenizer, tmp_path)
    assert [len(p.input_ids) for p in padded.prompts] == [150] * 24
    assert [p.ground_truth for p in padded.prompts] == [p.ground_truth for p in natural.prompts]
    assert tokenizer.decode(padded.prompts[0].input_ids).count(PREAMBLE[:20]) >= 1


def test_pad_prompts_refuses_a_length_below_a_natural_prompt() -> None:
    from trainer.models.presets import load_tokenizer

    with pytest.raises(ValueError, match=r"prompt_length=10: expected prompts of at most that many templated tokens"):
        pad_prompts(generate_rows(4, seed=1), load_tokenizer("tiny"), 10)


def test_padding_needs_the_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="prompt_length=64 needs the tokenizer"):
        write_synthetic_parquet(tmp_path / "x.parquet", 4, seed=1, prompt_length=64)
