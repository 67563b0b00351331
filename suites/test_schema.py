"""Property tests of the data layer, and checks of the data set a run will train on.

    pytest suites/test_schema.py                          # the synthetic math set
    pytest suites/test_schema.py --rl-dataset my.parquet  # your own VERL RL file

The dataset tests read ``--rl-dataset`` when the plugin provides that option; without it they check a
synthetic set. The file must have what the trainer reads (data_source, prompt, reward_model's ground
truth; text only), as any text RL file VERL's examples/data_preprocess scripts write does; how it
differs from the reference schema (gsm8k.py's shape, extra_info {split, index, answer, question}) is
a ``ReferenceSchemaWarning``, not a failure: add
``-W error::trainer.data.validate.ReferenceSchemaWarning`` to make that a strict check. With the
plugin, the set is also loaded as the suites load it (the run's tokenizer and data.* limits); a set
smaller than the run's batch sizes is a warning that names the sizes that fit, since checking the
schema needs no full batch.

The properties (hypothesis) hold for any valid rows: they survive a parquet round trip, every kind of
corruption is caught at its field path, any extra_info and other columns load, truncation keeps at
most max_prompt_length tokens from the right end, and filtering drops exactly the overlong prompts.
"""

from __future__ import annotations

import copy
import string
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainer.config import batch_size_problems
from trainer.data.loader import PromptTooLongError, filter_overlong, load_prompts, truncate_ids
from trainer.data.schema import COLUMNS, VALID_ROLES, rows_to_table, write_rows
from trainer.data.source import load_train_dataset
from trainer.data.synthetic import write_synthetic_parquet
from trainer.data.validate import (
    FILE_FIELD,
    ReferenceSchemaWarning,
    format_problems,
    read_valid_rows,
    reference_differences,
    validate_parquet,
    validate_rows,
)
from trainer.models.tokenizer import build_tokenizer

PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
QUICK = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SAMPLE_ROWS = 256  # rows of the data set the corruption property draws from


# ----------------------------------------------------------------------------- strategies of valid rows
# Parquet strings are UTF-8, so lone surrogates cannot be stored.
text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=24)
nonblank = text.filter(lambda s: bool(s.strip()))
messages = st.fixed_dictionaries({"role": st.sampled_from(sorted(VALID_ROLES)), "content": text})
valid_rows = st.fixed_dictionaries(
    {
        "data_source": text,
        "prompt": st.lists(messages, min_size=1, max_size=4),
        "ability": text,
        "reward_model": st.fixed_dictionaries(
            {"style": st.sampled_from(["rule", "model"]), "ground_truth": nonblank}
        ),
        "extra_info": st.fixed_dictionaries(
            {
                "split": st.sampled_from(["train", "test", "val"]),
                "index": st.integers(-(2**63), 2**63 - 1),
                "answer": text,
                "question": text,
            }
        ),
    }
)
datasets = st.lists(valid_rows, min_size=1, max_size=6)

# Rows with only what the trainer reads right: any extra_info (or none), any other columns, and the
# ground truths VERL's preprocessors write (a string; hellaswag.py's integer; Search-R1's answers).
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
answer_lists = st.lists(nonblank, min_size=1, max_size=3)
answers = st.one_of(nonblank, st.integers(), answer_lists, answer_lists.map(lambda a: {"target": a}))
trainer_rows = st.fixed_dictionaries(
    {
        "data_source": text,
        "prompt": st.lists(messages, min_size=1, max_size=4),
        "reward_model": st.fixed_dictionaries({"ground_truth": answers}, optional={"style": json_values}),
    },
    optional={"extra_info": json_values, "ability": json_values, "agent_name": json_values},
)

not_strings = st.one_of(
    st.integers(), st.floats(allow_nan=False), st.booleans(), st.lists(st.integers(), max_size=2)
)
not_integers = st.one_of(text, st.floats(allow_nan=False), st.booleans())
not_containers = st.one_of(text, st.integers())
not_answers = st.one_of(
    st.floats(allow_nan=False), st.booleans(), st.lists(st.integers(), min_size=1, max_size=2)
)

LEAVES_STRING = (
    "data_source",
    "ability",
    "reward_model.style",
    "reward_model.ground_truth",
    "extra_info.split",
    "extra_info.answer",
    "extra_info.question",
    "prompt[j].role",
    "prompt[j].content",
)
CONTAINERS = ("prompt", "reward_model", "extra_info")
# What a lenient validation checks: the fields the trainer reads.
TRAINER_LEAVES = ("data_source", "reward_model.ground_truth", "prompt[j].role", "prompt[j].content")
TRAINER_CONTAINERS = ("prompt", "reward_model")
CORRUPTIONS = (
    "missing_field",
    "wrong_type",
    "empty_prompt",
    "unknown_role",
    "non_string_content",
    "bad_ground_truth",
)


def _parent_and_key(row: dict[str, Any], path: str) -> tuple[Any, Any]:
    """The container holding the field at a dotted path like "prompt[2].role", and its key."""
    parts = path.replace("[", ".").replace("]", "").split(".")
    target: Any = row
    for part in parts[:-1]:
        target = target[int(part)] if part.isdigit() else target[part]
    return target, parts[-1]


def corrupt(
    data: st.DataObject, rows: list[dict[str, Any]], kind: str, strict: bool = True
) -> tuple[int, str]:
    """Break one field of one row in place, the ``kind`` way; return (row, field path) to expect.
    ``strict=False`` breaks only fields the trainer reads (what a lenient validation checks)."""
    i = data.draw(st.integers(0, len(rows) - 1), label="row")
    row = rows[i]
    j = data.draw(st.integers(0, len(row["prompt"]) - 1), label="message")
    fields = (
        LEAVES_STRING + CONTAINERS + ("extra_info.index",) if strict else TRAINER_LEAVES + TRAINER_CONTAINERS
    )
    if kind == "missing_field":
        path = data.draw(st.sampled_from(fields)).replace("[j]", f"[{j}]")
        parent, key = _parent_and_key(row, path)
        del parent[key]
    elif kind == "wrong_type":
        path = data.draw(st.sampled_from(fields)).replace("[j]", f"[{j}]")
        bad = (
            not_containers
            if path in CONTAINERS
            else not_integers
            if path == "extra_info.index"
            else not_answers
            if path == "reward_model.ground_truth" and not strict
            else not_strings
        )
        parent, key = _parent_and_key(row, path)
        parent[key] = data.draw(bad, label="value")
    elif kind == "empty_prompt":
        path = "prompt"
        row["prompt"] = []
    elif kind == "unknown_role":
        path = f"prompt[{j}].role"
        row["prompt"][j]["role"] = data.draw(text.filter(lambda s: s not in VALID_ROLES), label="role")
    elif kind == "non_string_content":
        path = f"prompt[{j}].content"
        row["prompt"][j]["content"] = data.draw(
            st.one_of(st.none(), not_strings, st.dictionaries(text, text, max_size=1))
        )
    else:
        path = "reward_model.ground_truth"
        blank = data.draw(
            st.one_of(st.none(), st.text(st.sampled_from(" \t\n\u3000"), max_size=3)), label="ground truth"
        )
        row["reward_model"]["ground_truth"] = blank
    return i, path


def assert_caught(rows: list[dict[str, Any]], i: int, path: str, strict: bool = True) -> None:
    problems = validate_rows(rows, strict=strict)
    assert [p for p in problems if p.row != i] == [], "a clean row was reported"
    assert path in {p.field for p in problems if p.row == i}, f"{path} not reported: {problems}"
    assert any(path in str(p) for p in problems)


# ----------------------------------------------------------------------------- the run's data set
@pytest.fixture(scope="module")
def dataset_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    given_path = request.config.getoption("--rl-dataset", default=None)
    if given_path:
        return Path(given_path)
    return write_synthetic_parquet(tmp_path_factory.mktemp("data") / "synthetic_math.parquet", 256, seed=0)


@pytest.fixture(scope="module")
def dataset_sample(dataset_path: Path) -> tuple[list[dict[str, Any]], bool]:
    """Rows of the data set, and whether it fits the reference schema (then its rows are corrupted
    and checked strictly; else only in the fields the trainer reads)."""
    if validate_parquet(dataset_path, strict=False):
        pytest.skip("the data set lacks what the trainer reads (see test_dataset_has_what_the_trainer_reads)")
    strict = not validate_parquet(dataset_path, strict=True)
    return read_valid_rows(dataset_path, strict=False)[:SAMPLE_ROWS], strict


def test_dataset_has_what_the_trainer_reads(dataset_path: Path) -> None:
    """What a run refuses at start-up: a missing or broken data_source, prompt or ground truth, or
    multi-modal data. Any extra_info and any other columns are fine."""
    problems = validate_parquet(dataset_path, strict=False)
    assert not problems, format_problems(str(dataset_path), problems, shown=20)


def test_dataset_differences_from_the_reference_schema_are_a_warning(dataset_path: Path) -> None:
    """How the file differs from the reference schema (schema.RL_SCHEMA, examples/data_preprocess/
    gsm8k.py's shape): a ReferenceSchemaWarning listing each difference, since the trainer reads the
    other shapes VERL's preprocessors write too. It needs no batch of prompts, nor the model.
    ``-W error::trainer.data.validate.ReferenceSchemaWarning`` makes it a strict check."""
    if validate_parquet(dataset_path, strict=False):
        pytest.skip("the trainer cannot read the data set (see test_dataset_has_what_the_trainer_reads)")
    differences = reference_differences(dataset_path)
    if differences:
        shown = differences[:20] + (
            [f"... and {len(differences) - 20} more"] if len(differences) > 20 else []
        )
        warnings.warn(
            ReferenceSchemaWarning(
                f"{dataset_path}: the trainer reads it, but it differs from VERL's reference schema "
                f"(what examples/data_preprocess/gsm8k.py writes) in {len(differences)} way(s):\n  "
                + "\n  ".join(shown)
            ),
            stacklevel=1,
        )


def test_dataset_fits_the_limits_the_suites_apply(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The prompts the suites would train on, loaded as the session loads them (load_train_dataset):
    the run's tokenizer, chat template, data.max_prompt_length and its truncation / filtering keys.
    Loaded here rather than through the session's rl_dataset, so the schema is checked whatever the
    set's size: a set smaller than the run's batch sizes is a ``BatchSizeWarning`` that lists every
    size a run would refuse and the values that fit (what the session's start-up check says)."""
    manager = request.config.pluginmanager
    if not (manager.hasplugin("rlbench") or manager.hasplugin("pytest_rlbench.plugin")):
        pytest.skip("the pytest-rlbench plugin is not loaded: no run configuration to check against")
    tokenizer = request.getfixturevalue("rl_model").tokenizer
    cfg = request.getfixturevalue("rl_config")
    given_path = request.config.getoption("--rl-dataset", default=None)
    data = replace(cfg.data, train_files=[str(given_path)] if given_path else [])  # []: the synthetic set
    dataset = load_train_dataset(data, tokenizer, tmp_path_factory.mktemp("limits"))
    longest = max(len(p.input_ids) for p in dataset.prompts)
    assert longest <= data.max_prompt_length, f"a prompt of {longest} tokens > data.max_prompt_length"
    sizes = batch_size_problems(cfg, len(dataset), str(dataset.source))
    if sizes:
        warnings.warn(
            BatchSizeWarning(f"a run on this set would be refused: {sizes.message()}"), stacklevel=1
        )


class BatchSizeWarning(UserWarning):
    """The data set is too small for the run's batch sizes: the schema is fine, a run is refused."""


@PROPERTY
@given(data=st.data(), kind=st.sampled_from(CORRUPTIONS))
def test_corrupting_a_row_of_the_dataset_is_caught(
    dataset_sample: tuple[list[dict[str, Any]], bool], data: st.DataObject, kind: str
) -> None:
    dataset_rows, strict = dataset_sample
    picks = data.draw(
        st.lists(st.sampled_from(range(len(dataset_rows))), min_size=1, max_size=4), label="rows"
    )
    rows = [copy.deepcopy(dataset_rows[k]) for k in picks]
    assert validate_rows(rows, strict=strict) == []
    i, path = corrupt(data, rows, kind, strict)
    assert_caught(rows, i, path, strict)


# ----------------------------------------------------------------------------- properties of any rows
@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("schema")


@PROPERTY
@given(rows=datasets)
def test_valid_rows_survive_a_parquet_round_trip(scratch: Path, rows: list[dict[str, Any]]) -> None:
    assert validate_rows(rows) == []
    path = write_rows(rows, scratch / "round_trip.parquet")
    assert validate_parquet(path) == []
    assert read_valid_rows(path) == rows


@PROPERTY
@given(rows=datasets, data=st.data(), kind=st.sampled_from(CORRUPTIONS))
def test_every_kind_of_corruption_is_caught_at_its_field(
    rows: list[dict[str, Any]], data: st.DataObject, kind: str
) -> None:
    i, path = corrupt(data, rows, kind)
    assert_caught(rows, i, path)


@PROPERTY
@given(rows=st.lists(trainer_rows, min_size=1, max_size=6))
def test_any_extra_info_and_any_other_column_pass_a_lenient_validation(rows: list[dict[str, Any]]) -> None:
    assert validate_rows(rows, strict=False) == []


@PROPERTY
@given(rows=st.lists(trainer_rows, min_size=1, max_size=4), data=st.data(), kind=st.sampled_from(CORRUPTIONS))
def test_a_lenient_validation_catches_every_corruption_of_what_the_trainer_reads(
    rows: list[dict[str, Any]], data: st.DataObject, kind: str
) -> None:
    i, path = corrupt(data, rows, kind, strict=False)
    assert_caught(rows, i, path, strict=False)


@PROPERTY
@given(rows=datasets, column=st.sampled_from(COLUMNS), drop=st.booleans())
def test_a_missing_or_mistyped_column_in_a_file_is_caught(
    scratch: Path, rows: list[dict[str, Any]], column: str, drop: bool
) -> None:
    table = rows_to_table(rows)
    if drop:
        table = table.drop_columns([column])
    else:
        table = table.set_column(
            table.column_names.index(column), column, pa.array(range(len(rows)), pa.int64())
        )
    path = scratch / "column.parquet"
    pq.write_table(table, path)
    problems = validate_parquet(path)
    assert [(p.row, p.field) for p in problems] == [(None, column)]
    assert problems[0].found == ("no such column" if drop else "column type int64")


@PROPERTY
@given(blob=st.binary(max_size=64).filter(lambda b: not b.startswith(b"PAR1")))
def test_a_file_that_is_not_parquet_is_caught(scratch: Path, blob: bytes) -> None:
    path = scratch / "not.parquet"
    path.write_bytes(blob)
    [problem] = validate_parquet(path)
    assert problem.field == FILE_FIELD and "parquet" in problem.expected


@QUICK
@given(rows=datasets, data=st.data())
def test_a_cut_short_parquet_file_is_caught(
    scratch: Path, rows: list[dict[str, Any]], data: st.DataObject
) -> None:
    whole = write_rows(rows, scratch / "whole.parquet").read_bytes()
    cut = scratch / "cut.parquet"
    cut.write_bytes(whole[: data.draw(st.integers(0, len(whole) - 1), label="cut at")])
    [problem] = validate_parquet(cut)
    assert problem.row is None and problem.field == FILE_FIELD


def test_a_missing_file_is_caught(scratch: Path) -> None:
    [problem] = validate_parquet(scratch / "never_written.parquet")
    assert (problem.field, problem.found) == (FILE_FIELD, "no such file")


# ----------------------------------------------------------------------------- truncation and filtering
@PROPERTY
@given(
    ids=st.lists(st.integers(0, 2**31), max_size=80),
    max_length=st.integers(1, 60),
    mode=st.sampled_from(["left", "right", "middle"]),
)
def test_truncation_keeps_at_most_max_length_from_the_right_end(
    ids: list[int], max_length: int, mode: str
) -> None:
    out = truncate_ids(ids, max_length, mode)
    assert len(out) == min(len(ids), max_length)
    if len(ids) <= max_length:
        assert out == ids
    elif mode == "left":
        assert out == ids[len(ids) - max_length :]
    elif mode == "right":
        assert out == ids[:max_length]
    else:
        head = max_length // 2
        assert out[:head] == ids[:head]
        assert out[head:] == ids[len(ids) - (max_length - head) :]


@PROPERTY
@given(ids=st.lists(st.integers(), max_size=40), max_length=st.integers(1, 40))
def test_error_truncation_raises_exactly_when_too_long(ids: list[int], max_length: int) -> None:
    if len(ids) > max_length:
        with pytest.raises(PromptTooLongError):
            truncate_ids(ids, max_length, "error")
    else:
        assert truncate_ids(ids, max_length, "error") == ids


@PROPERTY
@given(lists=st.lists(st.lists(st.integers(0, 9), max_size=30), max_size=20), max_length=st.integers(1, 30))
def test_filtering_drops_exactly_the_overlong(lists: list[list[int]], max_length: int) -> None:
    kept, dropped = filter_overlong(lists, max_length)
    assert sorted(kept + dropped) == list(range(len(lists)))
    assert dropped == [i for i, ids in enumerate(lists) if len(ids) > max_length]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@QUICK
@given(
    contents=st.lists(st.text(string.printable, max_size=60), min_size=1, max_size=8),
    max_length=st.integers(20, 80),
)
def test_loader_drops_exactly_the_prompts_whose_template_is_too_long(
    tokenizer, contents: list[str], max_length: int
) -> None:
    rows = [
        {
            "data_source": "prop",
            "prompt": [{"role": "user", "content": c}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "1"},
            "extra_info": {"split": "train", "index": k, "answer": "1", "question": c},
        }
        for k, c in enumerate(contents)
    ]
    # The reference lengths come from the tokenizer's own tokenize=True path, not the loader's.
    lengths = [
        len(
            tokenizer.apply_chat_template(
                r["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
        for r in rows
    ]
    fits = [k for k, n in enumerate(lengths) if n <= max_length]
    if not fits:
        with pytest.raises(PromptTooLongError):
            load_prompts(rows, tokenizer, max_length, filter_overlong_prompts=True)
        return
    ds = load_prompts(rows, tokenizer, max_length, filter_overlong_prompts=True)
    assert [p.row for p in ds] == fits
    assert ds.dropped_rows == [k for k, n in enumerate(lengths) if n > max_length]
    assert all(len(p.input_ids) == lengths[p.row] <= max_length for p in ds)
