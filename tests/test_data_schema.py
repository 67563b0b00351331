"""The VERL schema validator, case by case: every problem found, each naming its row and field path."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainer.data.schema import RL_SCHEMA, rows_to_table, write_rows
from trainer.data.validate import ANSWER_SHAPES as ANSWERS
from trainer.data.validate import (
    FILE_FIELD,
    TEXT_CONTENT,
    TEXT_ONLY,
    DatasetError,
    Problem,
    format_problems,
    read_valid_rows,
    reference_differences,
    schema_differences,
    validate,
    validate_parquet,
    validate_rows,
    validate_table,
)

ROLES = "one of assistant, system, tool, user"


def good_row(i: int = 0) -> dict:
    return {
        "data_source": "openai/gsm8k",
        "prompt": [
            {"role": "system", "content": "You are careful."},
            {"role": "user", "content": f"What is {i} + 1?"},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
        "extra_info": {
            "split": "train",
            "index": i,
            "answer": f"{i} + 1 = {i + 1}",
            "question": f"What is {i} + 1?",
        },
    }


def good_rows(n: int = 3) -> list[dict]:
    return [good_row(i) for i in range(n)]


# ----------------------------------------------------------------------------- valid data
def test_valid_rows_table_and_file_have_no_problems(tmp_path: Path) -> None:
    rows = good_rows()
    path = write_rows(rows, tmp_path / "train.parquet")
    assert validate_rows(rows) == []
    assert validate_table(rows_to_table(rows)) == []
    assert validate_parquet(path) == []
    assert pq.read_schema(path).equals(RL_SCHEMA)


def test_parquet_round_trip_gives_the_rows_back(tmp_path: Path) -> None:
    rows = good_rows()
    path = write_rows(rows, tmp_path / "sub" / "train.parquet")
    assert read_valid_rows(path) == rows
    assert read_valid_rows(str(path)) == rows


def test_pandas_records_with_numpy_arrays_are_valid(tmp_path: Path) -> None:
    # pandas hands list columns back as numpy object arrays; users pass such records.
    path = write_rows(good_rows(), tmp_path / "train.parquet")
    records = pd.read_parquet(path).to_dict("records")
    assert type(records[0]["prompt"]).__name__ == "ndarray"
    assert validate_rows(records) == []


LARGE = pa.schema(
    [
        ("data_source", pa.large_string()),
        ("prompt", pa.large_list(pa.struct([("role", pa.large_string()), ("content", pa.large_string())]))),
        ("ability", pa.string()),
        ("reward_model", RL_SCHEMA.field("reward_model").type),
        (
            "extra_info",
            pa.struct(
                [
                    ("split", pa.string()),
                    ("index", pa.int32()),
                    ("answer", pa.string()),
                    ("question", pa.string()),
                ]
            ),
        ),
    ]
)


def test_extra_columns_and_large_types_are_accepted() -> None:
    table = rows_to_table(good_rows()).append_column("difficulty", pa.array([1, 2, 3]))
    large = pa.schema(
        [
            ("data_source", pa.large_string()),
            (
                "prompt",
                pa.large_list(pa.struct([("role", pa.large_string()), ("content", pa.large_string())])),
            ),
            ("ability", pa.string()),
            ("reward_model", RL_SCHEMA.field("reward_model").type),
            (
                "extra_info",
                pa.struct(
                    [
                        ("split", pa.string()),
                        ("index", pa.int32()),
                        ("answer", pa.string()),
                        ("question", pa.string()),
                    ]
                ),
            ),
        ]
    )
    assert validate_table(table) == []
    assert validate_table(rows_to_table(good_rows()).cast(large)) == []


# ----------------------------------------------------------------------------- one case each (rows)
def corrupt(path: str, value: object, i: int = 1) -> list[dict]:
    """good_rows() with one dotted path in row i set to value (or deleted when value is ...)."""
    rows = good_rows()
    target = rows[i]
    keys = path.replace("[", ".").replace("]", "").split(".")
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target[key]
    last = int(keys[-1]) if keys[-1].isdigit() else keys[-1]
    if value is ...:
        del target[last]
    else:
        target[last] = value
    return rows


@pytest.mark.parametrize(
    ("path", "value", "expected", "found"),
    [
        ("ability", ..., "string", "missing"),
        ("extra_info.index", ..., "int64", "missing"),
        ("prompt[0].role", ..., "string", "missing"),
        ("data_source", 5, "string", "int 5"),
        ("prompt", "What is 2 + 2?", "list<struct{role, content}>", "'What is 2 + 2?'"),
        ("reward_model", ["rule", "2"], "struct{style, ground_truth}", "list ['rule', '2']"),
        ("extra_info.index", "7", "int64", "'7'"),
        ("extra_info.index", True, "int64", "bool True"),
        ("prompt", [], "at least one message", "an empty list"),
        ("prompt[1].role", "robot", ROLES, "'robot'"),
        ("prompt[1].role", "User", ROLES, "'User'"),
        ("prompt[1].content", 42, "string", "int 42"),
        ("prompt[1].content", None, "string", "null"),
        ("reward_model.ground_truth", ..., "string", "missing"),
        ("reward_model.ground_truth", None, "string", "null"),
        ("reward_model.ground_truth", "", "a non-empty string", "an empty string"),
        ("reward_model.ground_truth", "  ", "a non-empty string", "'  '"),
        ("reward_model.ground_truth", 4, "string", "int 4"),
    ],
)
def test_each_corruption_is_one_exact_problem(path: str, value: object, expected: str, found: str) -> None:
    assert validate_rows(corrupt(path, value)) == [Problem(1, path, expected, found)]


def test_every_problem_is_reported_in_row_order() -> None:
    rows = good_rows(4)
    rows[0]["prompt"][1]["role"] = "bot"
    rows[2]["reward_model"]["ground_truth"] = ""
    rows[2]["data_source"] = None
    rows[3]["prompt"] = []
    assert [(p.row, p.field) for p in validate_rows(rows)] == [
        (0, "prompt[1].role"),
        (2, "data_source"),
        (2, "reward_model.ground_truth"),
        (3, "prompt"),
    ]


def test_a_row_that_is_not_a_mapping_and_no_rows_at_all() -> None:
    assert validate_rows([good_row(), "oops"]) == [
        Problem(1, "<row>", "a mapping of column names to values", "'oops'")
    ]
    assert validate_rows([]) == [Problem(None, "<table>", "at least one row", "no rows")]


def test_lenient_mode_requires_only_what_the_trainer_reads() -> None:
    row = good_row()
    del row["extra_info"], row["ability"]
    row["reward_model"] = {"ground_truth": "1"}
    assert validate_rows([row], strict=False) == []
    assert {p.field for p in validate_rows([row])} == {"ability", "extra_info", "reward_model.style"}
    row["reward_model"] = {"style": "rule"}
    row["extra_info"] = {"index": "x"}  # what the trainer does not read is not checked at all
    assert validate_rows([row], strict=False) == [Problem(0, "reward_model.ground_truth", ANSWERS, "missing")]


@pytest.mark.parametrize(
    "extra_info",
    [
        {"split": "train", "index": 7},  # math_dataset.py, full_hh_rlhf.py, hellaswag.py
        {"index": "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079", "need_tools_kwargs": True},  # DAPO-Math-17k
        {"split": "train", "index": 0, "tools_kwargs": {"search": {"create_kwargs": {"question": "q"}}}},
        {},
        None,
        "not even a mapping",
    ],
)
def test_lenient_mode_accepts_any_extra_info(extra_info: object, tmp_path: Path) -> None:
    rows = good_rows()
    for r in rows:
        r["extra_info"] = extra_info
        r["ability"] = None
        r["agent_name"] = "tool_agent"
    assert validate_rows(rows, strict=False) == []
    assert read_valid_rows(rows, strict=False)[0]["extra_info"] == extra_info
    assert validate_rows(rows) != []  # the reference schema still wants its extra_info
    if isinstance(extra_info, dict) and extra_info:
        path = tmp_path / "other.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
        assert validate_parquet(path, strict=False) == []


@pytest.mark.parametrize(
    ("truth", "problem"),
    [
        ("42", None),
        (3, None),  # hellaswag.py: the label's index
        (["Paris", "paris, france"], None),
        ({"target": ["Paris"]}, None),  # the Search-R1 script
        ("  ", ("a non-empty string", "'  '")),
        (None, (ANSWERS, "null")),
        (True, (ANSWERS, "bool True")),
        (2.5, (ANSWERS, "float 2.5")),
        ([], (ANSWERS, "list []")),
        (["Paris", ""], (ANSWERS, "list ['Paris', '']")),
        ({"answers": ["Paris"]}, (ANSWERS, "dict {'answers': ['Paris']}")),
    ],
)
def test_lenient_ground_truths(truth: object, problem: tuple[str, str] | None) -> None:
    rows = corrupt("reward_model.ground_truth", truth)
    expected = [] if problem is None else [Problem(1, "reward_model.ground_truth", *problem)]
    assert validate_rows(rows, strict=False) == expected


def test_lenient_ground_truth_columns(tmp_path: Path) -> None:
    def table_with(truths: list, t: pa.DataType) -> pa.Table:
        table = rows_to_table(good_rows(len(truths)))
        reward = pa.StructArray.from_arrays([pa.array(truths, t)], names=["ground_truth"])
        return table.set_column(table.column_names.index("reward_model"), "reward_model", reward)

    assert validate_table(table_with([1, 2], pa.int64()), strict=False) == []
    targets = pa.struct([("target", pa.list_(pa.string()))])
    assert (
        validate_table(table_with([{"target": ["a"]}, {"target": ["b", "c"]}], targets), strict=False) == []
    )
    assert validate_table(table_with([1.5, 2.0], pa.float64()), strict=False) == [
        Problem(None, "reward_model.ground_truth", ANSWERS, "column type double")
    ]
    assert validate_table(table_with([{"target": []}, {"target": ["b"]}], targets), strict=False) == [
        Problem(0, "reward_model.ground_truth", ANSWERS, "dict {'target': []}")
    ]
    # strictly, the reference's string (and its style)
    assert validate_table(table_with([1, 2], pa.int64())) == [
        Problem(None, "reward_model.style", "string", "no such field"),
        Problem(None, "reward_model.ground_truth", "string", "column type int64"),
    ]


# ----------------------------------------------------------------------------- multi-modal data is refused
IMAGE = {"bytes": b"\x89PNG", "path": "a.png"}


@pytest.mark.parametrize("strict", [True, False])
def test_an_images_or_videos_column_with_content_is_refused(strict: bool) -> None:
    rows = good_rows(3)
    rows[1]["images"] = [IMAGE]
    rows[2]["videos"] = ["clip.mp4"]
    problems = validate_rows(rows, strict=strict)
    assert problems == [
        Problem(None, "images", TEXT_ONLY, "image data in 1 of 3 rows", column=True),
        Problem(None, "videos", TEXT_ONLY, "video data in 1 of 3 rows", column=True),
    ]
    assert str(problems[0]) == (
        "column images: expected no images or videos (multi-modal data is not supported: the trainer is "
        "text-only), found image data in 1 of 3 rows"
    )
    rows[0]["images"] = rows[0]["videos"] = rows[1]["videos"] = rows[2]["images"] = None
    table = pa.Table.from_pylist(rows)
    assert [(p.field, p.found) for p in validate_table(table, strict=strict)] == [
        ("images", "image data in 1 of 3 rows (list<struct{bytes, path}>)"),
        ("videos", "video data in 1 of 3 rows (list<string>)"),
    ]


def test_an_empty_images_column_is_text() -> None:
    # VERL's RLHFDataset skips None and empty lists: a mixed set's text rows
    rows = good_rows(2)
    rows[0]["images"], rows[1]["images"] = [], None
    assert validate_rows(rows, strict=False) == []
    assert validate_table(pa.Table.from_pylist(rows), strict=False) == []
    assert (
        validate_table(rows_to_table(good_rows(2)).append_column("videos", pa.nulls(2)), strict=False) == []
    )


def test_multimodal_message_content_is_refused_saying_so() -> None:
    rows = good_rows(2)
    rows[1]["prompt"][1]["content"] = [{"type": "image"}, {"type": "text", "text": "What is shown?"}]
    [problem] = validate_rows(rows, strict=False)
    assert (problem.row, problem.field, problem.expected) == (1, "prompt[1].content", TEXT_CONTENT)
    content = pa.list_(pa.struct([("type", pa.string()), ("text", pa.string())]))
    message = pa.struct([("role", pa.string()), ("content", content)])
    table = pa.table(
        {"data_source": ["x"], "prompt": pa.array([[{"role": "user", "content": []}]], pa.list_(message))}
    )
    table = table.append_column("reward_model", pa.array([{"ground_truth": "1"}]))
    assert validate_table(table, strict=False) == [
        Problem(None, "prompt[].content", TEXT_CONTENT, f"column type {content}")
    ]


def test_an_sft_file_is_refused_saying_what_it_is() -> None:
    table = pa.Table.from_pylist([{"messages": [{"role": "user", "content": "hi"}]}])
    [prompt] = [p for p in validate_table(table, strict=False) if p.field == "prompt"]
    assert "no such column (the file has a messages column: a supervised fine-tuning set" in prompt.found


# ----------------------------------------------------------------------------- differences from the reference
def test_the_reference_s_own_shape_has_no_differences(tmp_path: Path) -> None:
    path = write_rows(good_rows(), tmp_path / "train.parquet")
    assert schema_differences(RL_SCHEMA) == []
    assert reference_differences(path) == [] == reference_differences(good_rows())
    assert reference_differences(rows_to_table(good_rows()).cast(LARGE)) == []


def test_schema_differences_name_each_missing_added_and_retyped_field() -> None:
    schema = pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))),
            ("reward_model", pa.struct([("ground_truth", pa.int64()), ("style", pa.string())])),
            (
                "extra_info",
                pa.struct([("index", pa.string()), ("tools_kwargs", pa.struct([("a", pa.bool_())]))]),
            ),
            ("level", pa.string()),
        ]
    )
    assert schema_differences(schema) == [
        "ability: missing (the reference has a string column)",
        "reward_model.ground_truth: int64, the reference has string",
        "extra_info.split: missing (the reference has a string)",
        "extra_info.index: string, the reference has int64",
        "extra_info.answer: missing (the reference has a string)",
        "extra_info.question: missing (the reference has a string)",
        "extra_info.tools_kwargs: not in the reference (struct{a})",
        "level: a column not in the reference (string)",
    ]


def test_reference_differences_add_the_row_values_only_the_reference_refuses(tmp_path: Path) -> None:
    rows = good_rows(3)
    rows[1]["extra_info"]["answer"] = None
    rows[2]["ability"] = None
    path = write_rows(rows, tmp_path / "nulls.parquet")
    assert validate_parquet(path, strict=False) == []
    assert reference_differences(path) == [
        "row 1, extra_info.answer: expected string, found null",
        "row 2, ability: expected string, found null",
    ]
    rows[0]["reward_model"]["ground_truth"] = ""  # the trainer's problem: not a mere difference
    assert reference_differences(rows) == reference_differences(path)
    assert reference_differences(tmp_path / "absent.parquet") == []


# ----------------------------------------------------------------------------- tables (column-level)
def test_missing_column_and_missing_struct_field_are_reported_once() -> None:
    table = rows_to_table(good_rows(5)).drop_columns(["ability"])
    assert validate_table(table) == [Problem(None, "ability", "a column of type string", "no such column")]
    rows = good_rows(5)
    for r in rows:
        del r["extra_info"]["question"]
    assert validate_table(pa.Table.from_pylist(rows)) == [
        Problem(None, "extra_info.question", "string", "no such field")
    ]


def test_wrong_column_type_is_one_problem_not_one_per_row() -> None:
    rows = good_rows(50)
    for i, r in enumerate(rows):
        r["reward_model"]["ground_truth"] = i + 1
    problems = validate_table(pa.Table.from_pylist(rows))
    assert problems == [Problem(None, "reward_model.ground_truth", "string", "column type int64")]
    assert (
        str(problems[0]) == "every row, reward_model.ground_truth: expected string, found column type int64"
    )


def test_table_value_problems_name_their_rows() -> None:
    rows = good_rows(3)
    rows[1]["prompt"][0]["role"] = "narrator"
    rows[2]["reward_model"]["ground_truth"] = None
    assert validate_table(rows_to_table(rows)) == [
        Problem(1, "prompt[0].role", ROLES, "'narrator'"),
        Problem(2, "reward_model.ground_truth", "string", "null"),
    ]


def test_empty_table() -> None:
    assert validate_table(rows_to_table([])) == [Problem(None, "<table>", "at least one row", "no rows")]


# ----------------------------------------------------------------------------- files
def test_missing_file_and_directory(tmp_path: Path) -> None:
    assert validate_parquet(tmp_path / "nope.parquet") == [
        Problem(None, FILE_FIELD, "an existing parquet file", "no such file")
    ]
    assert validate_parquet(tmp_path) == [Problem(None, FILE_FIELD, "a parquet file", "a directory")]


def test_not_a_parquet_file(tmp_path: Path) -> None:
    csv = tmp_path / "train.csv"
    csv.write_text("data_source,prompt\nx,y\n")
    empty = tmp_path / "empty.parquet"
    empty.write_bytes(b"")
    assert validate_parquet(csv) == [
        Problem(None, FILE_FIELD, "a parquet file (starting with b'PAR1')", "a file starting with b'data'")
    ]
    assert validate_parquet(empty)[0].found == "an empty file"


def test_cut_short_parquet_is_unreadable(tmp_path: Path) -> None:
    good = write_rows(good_rows(), tmp_path / "good.parquet")
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(good.read_bytes()[:100])
    [problem] = validate_parquet(cut)
    assert (problem.row, problem.field, problem.expected) == (None, FILE_FIELD, "a readable parquet file")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path: Path) -> None:
    path = write_rows(good_rows(), tmp_path / "locked.parquet")
    path.chmod(0)
    try:
        [problem] = validate_parquet(path)
    finally:
        path.chmod(0o644)
    assert problem.expected == "a readable file" and problem.found.startswith("PermissionError")


def test_validate_dispatches_on_the_kind_of_source(tmp_path: Path) -> None:
    rows = corrupt("prompt[1].role", "robot")
    expected = [Problem(1, "prompt[1].role", ROLES, "'robot'")]
    assert validate(rows) == expected
    assert validate(rows_to_table(rows)) == expected
    assert validate(write_rows(rows, tmp_path / "t.parquet")) == expected


# ----------------------------------------------------------------------------- the error
def test_dataset_error_names_the_file_the_fields_and_the_rest(tmp_path: Path) -> None:
    rows = good_rows(8)
    for r in rows:
        r["prompt"][1]["role"] = "human"
    path = write_rows(rows, tmp_path / "boba.parquet")
    with pytest.raises(DatasetError) as info:
        read_valid_rows(path)
    err = info.value
    assert isinstance(err, ValueError)
    assert len(err.problems) == 8 and err.source == str(path)
    message = str(err)
    assert message.startswith(f"{path}: 8 problems with VERL's RL data schema:")
    assert "row 0, prompt[1].role: expected one of assistant, system, tool, user, found 'human'" in message
    assert "row 4, prompt[1].role" in message and "row 5," not in message
    assert message.endswith("... and 3 more")


def test_dataset_error_for_a_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(
        DatasetError,
        match=r"missing\.parquet: 1 problem with .*\n  file: expected an existing parquet file, found no such file",
    ):
        read_valid_rows(tmp_path / "missing.parquet")


def test_format_problems_without_overflow() -> None:
    problems = [Problem(0, "data_source", "string", "null")]
    assert format_problems("<rows>", problems) == (
        "<rows>: 1 problem with VERL's RL data schema:\n  row 0, data_source: expected string, found null"
    )


def test_validation_does_not_change_its_input() -> None:
    rows = corrupt("prompt[1].role", "robot")
    before = copy.deepcopy(rows)
    validate_rows(rows)
    assert rows == before
