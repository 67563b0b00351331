"""Check a data set against VERL's RL schema and report every problem, not just the first.

A training run that dies on row 40,312 after an hour of set-up wastes the hour; so the whole file is
checked before anything is loaded, and the error lists what was expected and what was found, row by
row, with the field's path (``prompt[0].role``, ``reward_model.ground_truth``).

Three entry points, one per kind of input, and ``validate`` that picks one:
``validate_parquet(path)``, ``validate_table(table)``, ``validate_rows(rows)``. They return
``list[Problem]`` (empty: valid). ``read_valid_rows`` raises ``DatasetError`` instead. How problems
read in a message is problems.py's concern; the names it defines are importable from here too.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import numpy as np
import pyarrow as pa
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
    RL_SCHEMA,
    TRAINER_FIELDS,
    VALID_ROLES,
    is_list_type,
    is_string_type,
)

PARQUET_MAGIC = b"PAR1"

Source = Union[str, os.PathLike, pa.Table, Sequence[Mapping[str, Any]]]


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


def _check_value(
    value: Any,
    t: pa.DataType,
    path: str,
    generic: str,
    row: int,
    required: frozenset[str],
    skip: frozenset[str],
) -> list[Problem]:
    """Problems with one value of type ``t`` at ``path`` (generic: list positions written as [])."""
    if generic in skip:
        return []
    if value is MISSING or value is None:
        return [Problem(row, path, describe_type(t), describe_value(value))] if generic in required else []
    if is_string_type(t):
        ok = isinstance(value, str)
    elif pa.types.is_integer(t):
        ok = _is_integer(value)
    elif is_list_type(t):
        ok = _is_sequence(value)
    else:
        ok = isinstance(value, Mapping)
    if not ok:
        return [Problem(row, path, describe_type(t), describe_value(value))]

    problems: list[Problem] = []
    if is_list_type(t):
        for i, item in enumerate(value):
            problems += _check_value(item, t.value_type, f"{path}[{i}]", f"{generic}[]", row, required, skip)
    elif pa.types.is_struct(t):
        for field in t:
            problems += _check_value(
                value.get(field.name, MISSING),
                field.type,
                f"{path}.{field.name}",
                f"{generic}.{field.name}",
                row,
                required,
                skip,
            )
    return problems + _check_rules(value, path, generic, row)


def check_row(
    row: Any, index: int, *, strict: bool = True, skip: frozenset[str] = frozenset()
) -> list[Problem]:
    """Every problem with one row (a mapping of column name to Python value). Columns not in the
    schema are allowed and ignored. ``skip`` names generic paths already reported for the whole table."""
    if not isinstance(row, Mapping):
        return [Problem(index, ROW_FIELD, "a mapping of column names to values", describe_value(row))]
    required = _required(strict)
    problems: list[Problem] = []
    for field in RL_SCHEMA:
        value = row.get(field.name, MISSING)
        problems += _check_value(value, field.type, field.name, field.name, index, required, skip)
    return problems


def validate_rows(rows: Iterable[Any], *, strict: bool = True) -> list[Problem]:
    """Every problem in a sequence of row dicts, in row order. ``strict=False`` requires only the
    fields the trainer reads (``schema.TRAINER_FIELDS``); present fields are type-checked either way."""
    problems: list[Problem] = []
    count = 0
    for index, row in enumerate(rows):
        problems += check_row(row, index, strict=strict)
        count += 1
    if count == 0:
        problems.append(Problem(None, TABLE_FIELD, "at least one row", "no rows"))
    return problems


# ----------------------------------------------------------------------------- tables (arrow types)
def _check_type(
    actual: pa.DataType, expected: pa.DataType, generic: str, required: frozenset[str]
) -> tuple[list[Problem], set[str]]:
    """Column-level problems (the type is wrong for every row at once) and the generic paths that
    row checks should skip because they are already reported."""
    if pa.types.is_null(actual):
        # Every value is null: the row checks report it per row if the field is required.
        return [], set()
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
        p, s = _check_type(actual.value_type, expected.value_type, f"{generic}[]", required)
        problems += p
        skip |= s
    elif pa.types.is_struct(expected):
        for field in expected:
            sub = f"{generic}.{field.name}"
            index = actual.get_field_index(field.name)
            if index < 0:
                if sub in required:
                    problems.append(Problem(None, sub, describe_type(field.type), "no such field"))
                skip.add(sub)
                continue
            p, s = _check_type(actual.field(index).type, field.type, sub, required)
            problems += p
            skip |= s
    return problems, skip


def validate_table(table: pa.Table, *, strict: bool = True) -> list[Problem]:
    """Every problem in an arrow table: wrong column types once per column, then value problems
    (nulls, empty prompts, unknown roles, empty ground truths) once per row."""
    required = _required(strict)
    problems: list[Problem] = []
    skip: set[str] = set()
    present: list[str] = []
    for field in RL_SCHEMA:
        if field.name not in table.column_names:
            if field.name in required:
                problems.append(
                    Problem(
                        None, field.name, f"a column of type {describe_type(field.type)}", "no such column"
                    )
                )
            skip.add(field.name)
            continue
        present.append(field.name)
        p, s = _check_type(table.schema.field(field.name).type, field.type, field.name, required)
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
    "Source",
    "check_row",
    "describe_type",
    "describe_value",
    "format_problems",
    "read_parquet",
    "read_valid_rows",
    "source_name",
    "validate",
    "validate_parquet",
    "validate_rows",
    "validate_table",
]
