"""The prompt loader: chat template, filtering, truncation, all-or-nothing loading, resumable batches."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from trainer.data import loader
from trainer.data.batches import BatchIterator, LoaderState, epoch_order
from trainer.data.loader import load_prompts
from trainer.data.problems import DatasetError
from trainer.data.schema import write_rows
from trainer.data.synthetic import generate_rows
from trainer.data.truncation import PromptTooLongError, filter_overlong, overlong_indices, truncate_ids
from trainer.models.tokenizer import build_tokenizer

TEN = list(range(10))


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def row(content: str, truth: str = "1", index: int = 0, role: str = "user") -> dict:
    return {
        "data_source": "test/lengths",
        "prompt": [{"role": role, "content": content}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": "train", "index": index, "answer": truth, "question": content},
    }


# The test tokenizer is one token per character; this template adds 19 tokens around a user message:
# <|im_start|> "user\n" ... <|im_end|> "\n" <|im_start|> "assistant\n"
OVERHEAD = 19


def sized_rows(lengths: list[int]) -> list[dict]:
    """Rows whose templated prompts are exactly these many tokens long."""
    return [row("x" * (n - OVERHEAD), truth=str(i), index=100 + i) for i, n in enumerate(lengths)]


# ----------------------------------------------------------------------------- pure helpers
@pytest.mark.parametrize(
    ("mode", "max_length", "expected"),
    [
        ("left", 4, [6, 7, 8, 9]),
        ("right", 4, [0, 1, 2, 3]),
        ("middle", 4, [0, 1, 8, 9]),
        ("middle", 5, [0, 1, 7, 8, 9]),
        ("middle", 1, [9]),
        ("left", 10, TEN),
        ("error", 10, TEN),
        ("middle", 11, TEN),
    ],
)
def test_truncate_ids_exact(mode: str, max_length: int, expected: list[int]) -> None:
    assert truncate_ids(TEN, max_length, mode) == expected


def test_truncate_ids_error_mode_and_bad_arguments() -> None:
    with pytest.raises(PromptTooLongError, match="prompt of 10 tokens is longer than max_prompt_length 9"):
        truncate_ids(TEN, 9)
    with pytest.raises(
        ValueError, match="truncation: expected one of error, left, right, middle, found 'center'"
    ):
        truncate_ids(TEN, 4, "center")
    with pytest.raises(ValueError, match="max_prompt_length: expected an integer >= 1, found 0"):
        truncate_ids(TEN, 0, "left")


def test_truncate_ids_returns_a_new_list() -> None:
    ids = [1, 2, 3]
    out = truncate_ids(ids, 5, "left")
    out.append(4)
    assert ids == [1, 2, 3]


def test_filter_overlong_drops_exactly_the_longer_ones() -> None:
    lists = [[1, 2], [1, 2, 3], [1], [], [1, 2, 3, 4]]
    assert filter_overlong(lists, 2) == ([0, 2, 3], [1, 4])
    assert overlong_indices([2, 3, 1, 0, 4], 2) == [1, 4]
    assert filter_overlong(lists, 4) == ([0, 1, 2, 3, 4], [])


def test_epoch_order() -> None:
    a = epoch_order(50, seed=1, epoch=0)
    assert sorted(a) == list(range(50)) and a != list(range(50))
    assert a == epoch_order(50, seed=1, epoch=0)
    assert a != epoch_order(50, seed=1, epoch=1)
    assert a != epoch_order(50, seed=2, epoch=0)
    assert epoch_order(5, seed=1, epoch=3, shuffle=False) == [0, 1, 2, 3, 4]
    assert epoch_order(0, seed=1, epoch=0) == [] and epoch_order(1, seed=1, epoch=0) == [0]
    # Pinned: a checkpoint's data order must survive library and Python upgrades.
    assert epoch_order(8, seed=0, epoch=0) == [6, 7, 2, 1, 4, 0, 3, 5]


# ----------------------------------------------------------------------------- loading
def test_load_applies_the_chat_template_with_generation_prompt(tokenizer, tmp_path: Path) -> None:
    path = write_rows([row("What is 2 + 3?", truth="5", index=7)], tmp_path / "one.parquet")
    ds = load_prompts(path, tokenizer, max_prompt_length=64)
    [p] = ds.prompts
    text = "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(p.input_ids) == text
    assert p.input_ids == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert (p.row, p.index, p.uid, p.ground_truth, p.data_source, p.truncated) == (
        0,
        7,
        "0",
        "5",
        "test/lengths",
        False,
    )
    assert ds.source == str(path) and ds.num_rows == 1 and ds.num_dropped == 0


def test_load_works_with_another_chat_template(tokenizer) -> None:
    other = build_tokenizer()
    other.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    rows = [row("hi"), row("2+2?", role="user")]
    rows[1]["prompt"].insert(0, {"role": "system", "content": "Be brief."})
    ds = load_prompts(rows, other, max_prompt_length=64)
    assert [other.decode(p.input_ids) for p in ds] == [
        "[user] hi\n[assistant] ",
        "[system] Be brief.\n[user] 2+2?\n[assistant] ",
    ]


def test_filter_overlong_prompts_drops_and_reports(tokenizer, caplog) -> None:
    rows = sized_rows([30, 41, 40, 25, 60])
    with caplog.at_level(logging.INFO, logger="trainer.data.loader"):
        ds = load_prompts(rows, tokenizer, max_prompt_length=40, filter_overlong_prompts=True)
    assert ds.dropped_rows == [1, 4] and ds.num_dropped == 2
    assert [p.row for p in ds] == [0, 2, 3]
    assert [p.index for p in ds] == [100, 102, 103] and [p.ground_truth for p in ds] == ["0", "2", "3"]
    assert [len(p.input_ids) for p in ds] == [30, 40, 25]
    assert "dropped 2 of 5 prompts" in caplog.text
    assert ds.summary().startswith("<rows>: 3 of 5 prompts kept, 2 dropped as longer than 40 tokens")


def test_truncation_error_names_file_rows_lengths_and_limit(tokenizer, tmp_path: Path) -> None:
    path = write_rows(sized_rows([30, 41, 40, 55]), tmp_path / "long.parquet")
    with pytest.raises(PromptTooLongError) as info:
        load_prompts(path, tokenizer, max_prompt_length=40)
    message = str(info.value)
    assert message.startswith(f"{path}: 2 prompt(s) longer than max_prompt_length 40 tokens")
    assert "row 1 has 41 tokens, row 3 has 55 tokens." in message


def test_truncation_error_lists_the_first_rows_and_counts_the_rest(tokenizer) -> None:
    with pytest.raises(PromptTooLongError, match=r"8 prompt\(s\).*row 4 has 30 tokens, and 3 more"):
        load_prompts(sized_rows([30] * 8), tokenizer, max_prompt_length=29)


def test_every_prompt_filtered_out_is_an_error(tokenizer) -> None:
    with pytest.raises(PromptTooLongError, match="found none of 2.*longest 50"):
        load_prompts(sized_rows([45, 50]), tokenizer, max_prompt_length=40, filter_overlong_prompts=True)


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_truncation_modes_in_the_loader(tokenizer, mode: str) -> None:
    rows = sized_rows([30, 45])
    full = load_prompts(rows, tokenizer, max_prompt_length=100)
    cut = load_prompts(rows, tokenizer, max_prompt_length=40, truncation=mode)
    assert cut[0].input_ids == full[0].input_ids and not cut[0].truncated
    assert cut[1].input_ids == truncate_ids(full[1].input_ids, 40, mode) and cut[1].truncated
    assert len(cut[1].input_ids) == 40 and cut.truncated_rows == [1]


def test_filter_wins_over_truncation(tokenizer) -> None:
    ds = load_prompts(sized_rows([30, 45]), tokenizer, 40, truncation="left", filter_overlong_prompts=True)
    assert [p.row for p in ds] == [0] and ds.truncated_rows == []


def test_invalid_data_raises_before_anything_loads(tokenizer, tmp_path: Path) -> None:
    rows = generate_rows(20, seed=0)
    rows[13]["prompt"][0]["role"] = "human"
    path = write_rows(rows, tmp_path / "bad.parquet")
    with pytest.raises(
        DatasetError, match=r"bad\.parquet: 1 problem.*\n  row 13, prompt\[0\]\.role: expected one of"
    ):
        load_prompts(path, tokenizer, max_prompt_length=256)
    with pytest.raises(DatasetError, match="no such file"):
        load_prompts(tmp_path / "absent.parquet", tokenizer, max_prompt_length=256)


def test_prompts_the_template_rejects_are_reported_by_row(tokenizer) -> None:
    strict = build_tokenizer()
    strict.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tool turns') }}{% endif %}"
        "{{ m['content'] }}{% endfor %}"
    )
    with pytest.raises(
        DatasetError,
        match=r"row 1, prompt: expected messages the chat template accepts, found .*no tool turns",
    ):
        load_prompts([row("a"), row("b", role="tool")], strict, max_prompt_length=64)


def test_tokenizer_without_chat_template(tokenizer) -> None:
    plain = build_tokenizer()
    plain.chat_template = None
    with pytest.raises(ValueError, match="expected a chat template"):
        load_prompts([row("a")], plain, max_prompt_length=64)


def test_bad_arguments(tokenizer) -> None:
    with pytest.raises(ValueError, match="truncation: expected one of"):
        load_prompts([row("a")], tokenizer, 64, truncation="both")
    with pytest.raises(ValueError, match="max_prompt_length: expected an integer >= 1, found -3"):
        load_prompts([row("a")], tokenizer, -3)


def test_lenient_loading_of_a_minimal_verl_file(tokenizer) -> None:
    minimal = {
        "data_source": "x",
        "prompt": [{"role": "user", "content": "q"}],
        "reward_model": {"ground_truth": "4"},
    }
    with pytest.raises(DatasetError, match="ability: expected string, found missing"):
        load_prompts([minimal], tokenizer, 64, strict=True)
    [p] = load_prompts([minimal], tokenizer, 64).prompts  # lenient: the default, what a run uses
    assert (p.index, p.ground_truth) == (0, "4")


@pytest.mark.parametrize(
    ("extra_info", "index"),
    [({"split": "train", "index": 7}, 7), ({"index": "9a9b6eb4-a1cb"}, 1), ({"split": "train"}, 1), (None, 1)],
)
def test_the_index_is_extra_info_s_integer_or_the_row(tokenizer, extra_info: object, index: int) -> None:
    rows = [row("a", index=5), {**row("b"), "extra_info": extra_info}]
    assert [p.index for p in load_prompts(rows, tokenizer, 64)] == [5, index]


@pytest.mark.parametrize(
    ("truth", "text"),
    [("4", "4"), (2, "2"), (["Paris", "paris"], "Paris"), ({"target": ["Paris", "paris"]}, "Paris")],
)
def test_the_ground_truth_is_the_text_the_reward_compares(tokenizer, truth: object, text: str) -> None:
    rows = [{**row("a"), "reward_model": {"style": "rule", "ground_truth": truth}}]
    [p] = load_prompts(rows, tokenizer, 64)
    assert p.ground_truth == text and isinstance(p.ground_truth, str)
    assert loader.ground_truth_text(truth) == text


# ----------------------------------------------------------------------------- batches
@pytest.fixture(scope="module")
def dataset(tokenizer):
    return load_prompts(generate_rows(10, seed=0, difficulty="tiny"), tokenizer, max_prompt_length=128)


def test_batches_cover_each_epoch_once_and_drop_the_remainder(dataset) -> None:
    it = dataset.batches(3, seed=5)
    assert it.batches_per_epoch == 3
    epoch0 = [next(it) for _ in range(3)]
    assert [(b.epoch, b.step, len(b)) for b in epoch0] == [(0, 0, 3), (0, 1, 3), (0, 2, 3)]
    rows = [p.row for b in epoch0 for p in b.prompts]
    assert len(set(rows)) == 9 and set(rows) == set(epoch_order(10, 5, 0)[:9])
    nxt = next(it)
    assert (nxt.epoch, nxt.step) == (1, 0)


def test_batch_fields(dataset) -> None:
    b = next(dataset.batches(4, seed=1))
    assert b.input_ids == [p.input_ids for p in b.prompts]
    assert b.ground_truths == [p.ground_truth for p in b.prompts]
    assert b.uids == [str(p.row) for p in b.prompts]
    assert b.data_sources == ["rlbench/synthetic_math"] * 4


def test_same_seed_same_stream_other_seed_other_stream(dataset) -> None:
    def take(seed: int) -> list[list[str]]:
        it = dataset.batches(2, seed=seed)
        return [next(it).uids for _ in range(12)]

    assert take(3) == take(3)
    assert take(3) != take(4)


@pytest.mark.parametrize("taken", [0, 1, 4, 5, 9])
def test_saved_state_resumes_the_same_next_batches(dataset, taken: int) -> None:
    it = dataset.batches(2, seed=9)  # 5 batches an epoch: taken=5 and 9 resume across an epoch boundary
    for _ in range(taken):
        next(it)
    saved = json.loads(json.dumps(it.state_dict()))  # a checkpoint stores it as JSON
    expected = [next(it) for _ in range(7)]
    resumed = dataset.batches(2, seed=0, state=saved)  # the state's seed wins
    assert [next(resumed) for _ in range(7)] == expected
    assert resumed.state == it.state


def test_state_is_canonical_and_round_trips(dataset) -> None:
    it = dataset.batches(5, seed=2)
    assert it.state == LoaderState(seed=2, epoch=0, position=0, batch_size=5, num_prompts=10, shuffle=True)
    next(it)
    assert (it.state.epoch, it.state.position) == (0, 1)
    next(it)
    assert (it.state.epoch, it.state.position) == (1, 0)  # rolled over eagerly
    assert LoaderState.from_dict(it.state_dict()) == it.state


def test_restoring_a_state_from_another_stream_is_an_error(dataset) -> None:
    state = dataset.batches(2, seed=1).state_dict()
    with pytest.raises(ValueError, match="batch_size was 2 when saved, but this stream has 5"):
        dataset.batches(5, state=state)
    with pytest.raises(ValueError, match="shuffle was True when saved, but this stream has False"):
        dataset.batches(2, shuffle=False, state=state)
    with pytest.raises(ValueError, match=r"0 <= position < 5, found epoch 0, position 5"):
        dataset.batches(2, state={**state, "position": 5})
    with pytest.raises(ValueError, match=r"missing \['epoch'\]"):
        dataset.batches(2, state={k: v for k, v in state.items() if k != "epoch"})


def test_max_epochs_ends_the_stream_and_no_shuffle_keeps_order(dataset) -> None:
    batches = list(dataset.batches(4, seed=0, shuffle=False, max_epochs=2))
    assert [b.uids for b in batches] == [["0", "1", "2", "3"], ["4", "5", "6", "7"]] * 2


def test_batch_size_must_fit_the_data_set(dataset) -> None:
    with pytest.raises(ValueError, match="expected at most the data set's 10 prompts, found 11"):
        dataset.batches(11)
    with pytest.raises(ValueError, match="train_batch_size: expected an integer >= 1, found 0"):
        dataset.batches(0)
    with pytest.raises(ValueError, match="train_batch_size: expected an integer >= 1, found 0"):
        BatchIterator(dataset.prompts, LoaderState(seed=1, batch_size=0, num_prompts=10))
    with pytest.raises(ValueError, match="loader state: num_prompts 9, but the stream has 10"):
        BatchIterator(dataset.prompts, LoaderState(seed=1, batch_size=2, num_prompts=9))


def test_the_loader_still_exports_what_callers_import() -> None:
    # grpo_trainer, pytest_rlbench, suites/ and benchmarks/ import these from trainer.data.loader.
    for name in ("PromptBatch", "PromptDataset", "PromptTooLongError", "filter_overlong", "truncate_ids",
                 "template_prompts", "BatchIterator", "LoaderState", "epoch_order", "overlong_indices"):
        assert getattr(loader, name).__name__ == name
