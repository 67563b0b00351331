"""Check a data set against VERL's RL schema and report every problem, not just the first.

A training run that dies on row 40,312 after an hour of set-up wastes the hour; so the whole file is
checked before anything is loaded, and the error lists what was expected and what was found, row by
row, with the field's path (``prompt[0].role``, ``reward_model.ground_truth``).

Three entry points, one per kind of input, and ``validate`` that picks one:
``validate_parquet(path)``, ``validate_table(table)``, ``validate_rows(rows)``. They return
``list[Problem]`` (empty: valid). ``read_valid_rows`` raises ``DatasetError`` instead. How problems
read in a message is problems.py's concern; the names it defines are importable from here too.

Two levels. ``strict=True`` checks the reference schema (schema.RL_SCHEMA, gsm8k-shaped) field by
field. ``strict=False`` is what loading uses: it requires what the trainer reads (schema.TRAINER_SCHEMA)
and nothing else, so every text RL file VERL's preprocessors write loads, whatever its extra_info,
ability, reward_model.style or other columns; its ground truth may be a string, an integer
(hellaswag.py) or a list of answers (the Search-R1 script's {target: [...]}). Both refuse multi-modal
data (an images or videos column with content, or message contents that are not text).
``reference_differences`` lists how a data set differs from the reference without refusing it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from trainer.data.problems import (
    FILE_FIELD,
    MISSING,
    ROW_FIELD,
    SHOWN_PROBLEMS,
    TABLE_FIELD,
    DatasetError,
    Problem,
    describe_type,
    describe_value,
    format_problems,
    shorten,
)
from trainer.data.schema import (
    ALL_FIELDS,
    MULTIMODAL_COLUMNS,
    RL_SCHEMA,
    TRAINER_FIELDS,
    TRAINER_SCHEMA,
    VALID_ROLES,
    is_list_type,
    is_string_type,
)

PARQUET_MAGIC = b"PAR1"

Source = Union[str, os.PathLike, pa.Table, Sequence[Mapping[str, Any]]]

GROUND_TRUTH = "reward_model.ground_truth"
CONTENT = "prompt[].content"
# What a lenient validation accepts as a ground truth (loader.ground_truth_text turns it into text).
ANSWER_SHAPES = "a string, an integer, or a non-empty list of strings (alone or as {target: [...]})"
TEXT_CONTENT = "string (text only: multi-modal message content is not supported)"
TEXT_ONLY = "no images or videos (multi-modal data is not supported: the trainer is text-only)"


class ReferenceSchemaWarning(UserWarning):
    """A data set the trainer reads that differs from the reference schema (schema.RL_SCHEMA).
    ``-W error::trainer.data.validate.ReferenceSchemaWarning`` makes the difference an error."""


def _schema(strict: bool) -> pa.Schema:
    return RL_SCHEMA if strict else TRAINER_SCHEMA


def _required(strict: bool) -> frozenset[str]:
    return ALL_FIELDS if strict else TRAINER_FIELDS


# ----------------------------------------------------------------------------- rows (Python values)
def _is_sequence(value: Any) -> bool:
    # numpy arrays too: pandas hands list columns back as object arrays.
    return isinstance(value, (list, tuple, np.ndarray))


def _is_integer(value: Any) -> bool:
    # bool is an int in Python, but True is no row index.
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _check_rules(value: Any, path: str, generic: str, row: int) -> list[Problem]:
    """The checks beyond types, keyed by the field's generic path."""
    if generic == "prompt" and len(value) == 0:
        return [Problem(row, path, "at least one message", "an empty list")]
    if generic == "prompt[].role" and value not in VALID_ROLES:
        return [Problem(row, path, "one of " + ", ".join(sorted(VALID_ROLES)), describe_value(value))]
    if generic == "reward_model.ground_truth" and not value.strip():
        return [Problem(row, path, "a non-empty string", describe_value(value))]
    return []


def _check_answer(value: Any, path: str, row: int) -> list[Problem]:
    """A lenient ground truth: a non-blank string, an integer, or non-blank strings (a list, or a
    mapping's ``target`` list as the Search-R1 script writes)."""
    if isinstance(value, str):
        return [] if value.strip() else [Problem(row, path, "a non-empty string", describe_value(value))]
    if _is_integer(value):
        return []
    answers = value.get("target", MISSING) if isinstance(value, Mapping) else value
    if _is_sequence(answers) and len(answers) > 0 and all(isinstance(a, str) and a.strip() for a in answers):
        return []
    return [Problem(row, path, ANSWER_SHAPES, describe_value(value))]


def _check_value(
    value: Any,
    t: pa.DataType,
    path: str,
    generic: str,
    row: int,
    strict: bool,
    skip: frozenset[str],
) -> list[Problem]:
    """Problems with one value of type ``t`` at ``path`` (generic: list positions written as [])."""
    if generic in skip:
        return []
    if value is MISSING or value is None:
        if generic not in _required(strict):
            return []
        expected = ANSWER_SHAPES if generic == GROUND_TRUTH and not strict else describe_type(t)
        return [Problem(row, path, expected, describe_value(value))]
    if generic == GROUND_TRUTH and not strict:
        return _check_answer(value, path, row)
    if is_string_type(t):
        ok = isinstance(value, str)
    elif pa.types.is_integer(t):
        ok = _is_integer(value)
    elif is_list_type(t):
        ok = _is_sequence(value)
    else:
        ok = isinstance(value, Mapping)
    if not ok:
        container = _is_sequence(value) or isinstance(value, Mapping)
        expected = TEXT_CONTENT if generic == CONTENT and container else describe_type(t)
        return [Problem(row, path, expected, describe_value(value))]

    problems: list[Problem] = []
    if is_list_type(t):
        for i, item in enumerate(value):
            problems += _check_value(item, t.value_type, f"{path}[{i}]", f"{generic}[]", row, strict, skip)
    elif pa.types.is_struct(t):
        for field in t:
            problems += _check_value(
                value.get(field.name, MISSING),
                field.type,
                f"{path}.{field.name}",
                f"{generic}.{field.name}",
                row,
                strict,
                skip,
            )
    return problems + _check_rules(value, path, generic, row)


def check_row(
    row: Any, index: int, *, strict: bool = True, skip: frozenset[str] = frozenset()
) -> list[Problem]:
    """Every problem with one row (a mapping of column name to Python value). Columns not in the
    schema are allowed and ignored. ``skip`` names generic paths already reported for the whole table.
    (Multi-modal columns are checked over the whole data set: ``validate_rows``, ``validate_table``.)"""
    if not isinstance(row, Mapping):
        return [Problem(index, ROW_FIELD, "a mapping of column names to values", describe_value(row))]
    problems: list[Problem] = []
    for field in _schema(strict):
        value = row.get(field.name, MISSING)
        problems += _check_value(value, field.type, field.name, field.name, index, strict, skip)
    return problems


def _has_media(value: Any) -> bool:
    """Whether a row's images / videos value holds anything (VERL skips None and empty lists)."""
    if value is MISSING or value is None:
        return False
    if isinstance(value, (str, bytes)) or _is_sequence(value) or isinstance(value, Mapping):
        return len(value) > 0
    return True


def _media_problem(column: str, with_media: int, rows: int, type_text: str = "") -> Problem:
    kind = column.removesuffix("s")
    found = f"{kind} data in {with_media} of {rows} rows" + (f" ({type_text})" if type_text else "")
    return Problem(None, column, TEXT_ONLY, found, column=True)


def validate_rows(rows: Iterable[Any], *, strict: bool = True) -> list[Problem]:
    """Every problem in a sequence of row dicts, in row order. ``strict=False`` requires only the
    fields the trainer reads (``schema.TRAINER_SCHEMA``) and checks nothing else."""
    problems: list[Problem] = []
    media = dict.fromkeys(MULTIMODAL_COLUMNS, 0)
    count = 0
    for index, row in enumerate(rows):
        problems += check_row(row, index, strict=strict)
        if isinstance(row, Mapping):
            for column in media:
                media[column] += _has_media(row.get(column, MISSING))
        count += 1
    if count == 0:
        problems.append(Problem(None, TABLE_FIELD, "at least one row", "no rows"))
    return [_media_problem(c, n, count) for c, n in media.items() if n] + problems


# ----------------------------------------------------------------------------- tables (arrow types)
def _answer_type_ok(t: pa.DataType) -> bool:
    """A column type that can hold a lenient ground truth (``_check_answer`` checks the values)."""
    if is_string_type(t) or pa.types.is_integer(t):
        return True
    if pa.types.is_struct(t) and t.get_field_index("target") >= 0:
        t = t.field("target").type
    return is_list_type(t) and (is_string_type(t.value_type) or pa.types.is_null(t.value_type))


def _check_type(
    actual: pa.DataType, expected: pa.DataType, generic: str, strict: bool
) -> tuple[list[Problem], set[str]]:
    """Column-level problems (the type is wrong for every row at once) and the generic paths that
    row checks should skip because they are already reported."""
    if pa.types.is_null(actual):
        # Every value is null: the row checks report it per row if the field is required.
        return [], set()
    if generic == GROUND_TRUTH and not strict:
        if _answer_type_ok(actual):
            return [], set()
        return [Problem(None, generic, ANSWER_SHAPES, f"column type {actual}")], {generic}
    if generic == CONTENT and (is_list_type(actual) or pa.types.is_struct(actual)):
        return [Problem(None, generic, TEXT_CONTENT, f"column type {actual}")], {generic}
    if is_string_type(expected):
        ok = is_string_type(actual)
    elif pa.types.is_integer(expected):
        ok = pa.types.is_integer(actual)
    elif is_list_type(expected):
        ok = is_list_type(actual)
    else:
        ok = pa.types.is_struct(actual)
    if not ok:
        return [Problem(None, generic, describe_type(expected), f"column type {actual}")], {generic}

    problems: list[Problem] = []
    skip: set[str] = set()
    if is_list_type(expected):
        p, s = _check_type(actual.value_type, expected.value_type, f"{generic}[]", strict)
        problems += p
        skip |= s
    elif pa.types.is_struct(expected):
        for field in expected:
            sub = f"{generic}.{field.name}"
            index = actual.get_field_index(field.name)
            if index < 0:
                if sub in _required(strict):
                    problems.append(Problem(None, sub, describe_type(field.type), "no such field"))
                skip.add(sub)
                continue
            p, s = _check_type(actual.field(index).type, field.type, sub, strict)
            problems += p
            skip |= s
    return problems, skip


def _media_rows(column: pa.ChunkedArray) -> int:
    """How many rows of an images / videos column hold anything."""
    t = column.type
    if pa.types.is_null(t):
        return 0
    if is_list_type(t) or is_string_type(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        lengths = pc.list_value_length(column) if is_list_type(t) else pc.binary_length(column)
        return int(pc.sum(pc.greater(lengths, 0)).as_py() or 0)
    return len(column) - column.null_count


def _multimodal_problems(table: pa.Table) -> list[Problem]:
    problems = []
    for name in MULTIMODAL_COLUMNS:
        if name in table.column_names:
            column = table.column(name)
            with_media = _media_rows(column)
            if with_media:
                problems.append(_media_problem(name, with_media, table.num_rows, describe_type(column.type)))
    return problems


def _missing_column(field: pa.Field, table: pa.Table) -> Problem:
    found = "no such column"
    if field.name == "prompt" and "messages" in table.column_names:
        found += " (the file has a messages column: a supervised fine-tuning set, not an RL one)"
    return Problem(None, field.name, f"a column of type {describe_type(field.type)}", found)


def validate_table(table: pa.Table, *, strict: bool = True) -> list[Problem]:
    """Every problem in an arrow table: multi-modal columns and wrong column types once per column,
    then value problems (nulls, empty prompts, unknown roles, empty ground truths) once per row."""
    required = _required(strict)
    problems: list[Problem] = _multimodal_problems(table)
    skip: set[str] = set()
    present: list[str] = []
    for field in _schema(strict):
        if field.name not in table.column_names:
            if field.name in required:
                problems.append(_missing_column(field, table))
            skip.add(field.name)
            continue
        present.append(field.name)
        p, s = _check_type(table.schema.field(field.name).type, field.type, field.name, strict)
        problems += p
        skip |= s
    if table.num_rows == 0:
        problems.append(Problem(None, TABLE_FIELD, "at least one row", "no rows"))
        return problems

    frozen_skip = frozenset(skip)
    offset = 0
    # Batch by batch, so a large file is never all Python objects at once.
    for batch in table.select(present).to_batches(max_chunksize=4096):
        for i, row in enumerate(batch.to_pylist()):
            problems += check_row(row, offset + i, strict=strict, skip=frozen_skip)
        offset += batch.num_rows
    return problems


# ----------------------------------------------------------------------------- files
def read_parquet(path: str | os.PathLike) -> tuple[pa.Table | None, list[Problem]]:
    """Read a parquet file; on failure return None and the file-level problem instead of raising."""
    p = Path(path)
    if not p.exists():
        return None, [Problem(None, FILE_FIELD, "an existing parquet file", "no such file")]
    if p.is_dir():
        return None, [Problem(None, FILE_FIELD, "a parquet file", "a directory")]
    try:
        with open(p, "rb") as f:
            head = f.read(len(PARQUET_MAGIC))
    except OSError as exc:
        return None, [
            Problem(None, FILE_FIELD, "a readable file", f"{type(exc).__name__}: {exc.strerror or exc}")
        ]
    if head != PARQUET_MAGIC:
        found = "an empty file" if not head else f"a file starting with {head!r}"
        return None, [Problem(None, FILE_FIELD, f"a parquet file (starting with {PARQUET_MAGIC!r})", found)]
    try:
        return pq.read_table(p), []
    except (pa.ArrowException, OSError) as exc:
        return None, [
            Problem(None, FILE_FIELD, "a readable parquet file", shorten(f"{type(exc).__name__}: {exc}", 200))
        ]


def validate_parquet(path: str | os.PathLike, *, strict: bool = True) -> list[Problem]:
    """Every problem with a parquet file: unreadable or not parquet, or what ``validate_table`` finds."""
    table, problems = read_parquet(path)
    return problems if table is None else validate_table(table, strict=strict)


def validate(source: Source, *, strict: bool = True) -> list[Problem]:
    """Every problem with a parquet path, an arrow table, or a sequence of row dicts."""
    if isinstance(source, (str, os.PathLike)):
        return validate_parquet(source, strict=strict)
    if isinstance(source, pa.Table):
        return validate_table(source, strict=strict)
    return validate_rows(source, strict=strict)


# ----------------------------------------------------------------------------- the reference schema
def _same_kind(actual: pa.DataType, expected: pa.DataType) -> bool:
    """Whether two types are the same kind as the validator sees them (string ~ large_string,
    int32 ~ int64, list ~ large_list)."""
    if is_string_type(expected):
        return is_string_type(actual)
    if pa.types.is_integer(expected):
        return pa.types.is_integer(actual)
    if is_list_type(expected):
        return is_list_type(actual)
    if pa.types.is_struct(expected):
        return pa.types.is_struct(actual)
    return actual.equals(expected)


def _type_differences(actual: pa.DataType, expected: pa.DataType, path: str) -> list[str]:
    if not _same_kind(actual, expected):
        return [f"{path}: {describe_type(actual)}, the reference has {describe_type(expected)}"]
    if is_list_type(expected):
        return _type_differences(actual.value_type, expected.value_type, f"{path}[]")
    if not pa.types.is_struct(expected):
        return []
    lines: list[str] = []
    for field in expected:
        index = actual.get_field_index(field.name)
        if index < 0:
            lines.append(f"{path}.{field.name}: missing (the reference has a {describe_type(field.type)})")
        else:
            lines += _type_differences(actual.field(index).type, field.type, f"{path}.{field.name}")
    names = {field.name for field in expected}
    for i in range(actual.num_fields):
        if actual.field(i).name not in names:
            added = actual.field(i)
            lines.append(f"{path}.{added.name}: not in the reference ({describe_type(added.type)})")
    return lines


def schema_differences(schema: pa.Schema, reference: pa.Schema = RL_SCHEMA) -> list[str]:
    """How an arrow schema differs from the reference schema (gsm8k.py's shape), one line per column
    or struct field that is missing, added, or of another kind of type. Reads no rows."""
    lines: list[str] = []
    for field in reference:
        if field.name in schema.names:
            lines += _type_differences(schema.field(field.name).type, field.type, field.name)
        else:
            lines.append(f"{field.name}: missing (the reference has a {describe_type(field.type)} column)")
    for field in schema:
        if field.name not in reference.names:
            lines.append(f"{field.name}: a column not in the reference ({describe_type(field.type)})")
    return lines


def reference_differences(source: Source) -> list[str]:
    """How a data set differs from the reference schema, without refusing it: ``schema_differences``
    (for a file or a table), then the row values only a strict validation refuses (a null
    extra_info.answer, a row's integer ground truth), one line each. Empty: the data set has the
    reference's shape. Meant for a data set a lenient validation passes: what stops loading is that
    validation's to report (row problems it reports are left out here, and an unreadable file gives
    no lines)."""
    data: pa.Table | list[Any] | None
    if isinstance(source, (str, os.PathLike)):
        data, _ = read_parquet(source)  # read once, validated twice
        if data is None:
            return []
    else:
        data = source if isinstance(source, pa.Table) else list(source)
    lines = schema_differences(data.schema) if isinstance(data, pa.Table) else []
    lenient = {(p.row, p.field) for p in validate(data, strict=False)}
    lines += [
        str(p) for p in validate(data, strict=True) if p.row is not None and (p.row, p.field) not in lenient
    ]
    return lines


def source_name(source: Source) -> str:
    """How errors name a source: the file's path, or what kind of in-memory data it was."""
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    if isinstance(source, pa.Table):
        return "<arrow table>"
    return "<rows>"


def read_valid_rows(source: Source, *, strict: bool = True) -> list[dict[str, Any]]:
    """The rows of a valid data set as dicts; raise ``DatasetError`` listing every problem otherwise."""
    if isinstance(source, (str, os.PathLike)):
        table, problems = read_parquet(source)
        if table is not None:
            problems = validate_table(table, strict=strict)
    elif isinstance(source, pa.Table):
        table, problems = source, validate_table(source, strict=strict)
    else:
        rows = list(source)  # a generator would be spent by validating it
        table, problems = None, validate_rows(rows, strict=strict)
    if problems:
        raise DatasetError(source_name(source), problems)
    if table is not None:
        return table.to_pylist()
    return [dict(row) for row in rows]


# Callers import the problem types from here as well as from problems.py.
__all__ = [
    "FILE_FIELD",
    "ROW_FIELD",
    "SHOWN_PROBLEMS",
    "TABLE_FIELD",
    "DatasetError",
    "Problem",
    "ReferenceSchemaWarning",
    "Source",
    "check_row",
    "describe_type",
    "describe_value",
    "format_problems",
    "read_parquet",
    "read_valid_rows",
    "reference_differences",
    "schema_differences",
    "source_name",
    "validate",
    "validate_parquet",
    "validate_rows",
    "validate_table",
]
