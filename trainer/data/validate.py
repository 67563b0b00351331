"""Check a data set against VERL's RL schema and report every problem, not just the first.

A training run that dies on row 40,312 after an hour of set-up wastes the hour; so the whole file is
checked before anything is loaded, and the error lists what was expected and what was found, row by
row, with the field's path (``prompt[0].role``, ``reward_model.ground_truth``).

Three entry points, one per kind of input, and ``validate`` that picks one:
``validate_parquet(path)``, ``validate_table(table)``, ``validate_rows(rows)``. They return
``list[Problem]`` (empty: valid). ``read_valid_rows`` raises ``DatasetError`` instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trainer.data.schema import ALL_FIELDS, RL_SCHEMA, TRAINER_FIELDS, VALID_ROLES

# Field names for problems that are not about one field of one row.
FILE_FIELD = "<file>"
TABLE_FIELD = "<table>"
ROW_FIELD = "<row>"

PARQUET_MAGIC = b"PAR1"
SHOWN_PROBLEMS = 5  # how many problems an error message spells out before "and N more"

Source = Union[str, os.PathLike, pa.Table, Sequence[Mapping[str, Any]]]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a data set. ``row`` is None when it holds for the file or a whole column."""

    row: int | None
    field: str
    expected: str
    found: str

    def __str__(self) -> str:
        if self.field == FILE_FIELD:
            where = "file"
        elif self.row is None:
            where = f"every row, {self.field}"
        else:
            where = f"row {self.row}, {self.field}"
        return f"{where}: expected {self.expected}, found {self.found}"


class DatasetError(ValueError):
    """A data set does not fit VERL's RL schema. ``problems`` holds every problem found."""

    def __init__(self, source: str, problems: Sequence[Problem], shown: int = SHOWN_PROBLEMS) -> None:
        self.source = source
        self.problems: list[Problem] = list(problems)
        super().__init__(format_problems(source, self.problems, shown))


def format_problems(source: str, problems: Sequence[Problem], shown: int = SHOWN_PROBLEMS) -> str:
    """A message naming ``source`` and the first ``shown`` problems, with a count of the rest."""
    noun = "problem" if len(problems) == 1 else "problems"
    lines = [f"{source}: {len(problems)} {noun} with VERL's RL data schema:"]
    lines += [f"  {p}" for p in problems[:shown]]
    if len(problems) > shown:
        lines.append(f"  ... and {len(problems) - shown} more")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- describing things
class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING: Any = _Missing()


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_value(value: Any) -> str:
    """How a found value reads in a problem: its type and a short repr."""
    if value is MISSING:
        return "missing"
    if value is None:
        return "null"
    if isinstance(value, str):
        return _short(repr(value)) if value else "an empty string"
    return f"{type(value).__name__} {_short(repr(value))}"


def describe_type(t: pa.DataType) -> str:
    """A schema type in the words problems use: string, int64, list<struct{role, content}>."""
    if _is_string(t):
        return "string"
    if pa.types.is_integer(t):
        return "int64"
    if _is_list(t):
        return f"list<{describe_type(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct{" + ", ".join(t.field(i).name for i in range(t.num_fields)) + "}"
    return str(t)


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _is_list(t: pa.DataType) -> bool:
    return (
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
    )


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
    if _is_string(t):
        ok = isinstance(value, str)
    elif pa.types.is_integer(t):
        ok = _is_integer(value)
    elif _is_list(t):
        ok = _is_sequence(value)
    else:
        ok = isinstance(value, Mapping)
    if not ok:
        return [Problem(row, path, describe_type(t), describe_value(value))]

    problems: list[Problem] = []
    if _is_list(t):
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
    if _is_string(expected):
        ok = _is_string(actual)
    elif pa.types.is_integer(expected):
        ok = pa.types.is_integer(actual)
    elif _is_list(expected):
        ok = _is_list(actual)
    else:
        ok = pa.types.is_struct(actual)
    if not ok:
        return [Problem(None, generic, describe_type(expected), f"column type {actual}")], {generic}

    problems: list[Problem] = []
    skip: set[str] = set()
    if _is_list(expected):
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
            Problem(None, FILE_FIELD, "a readable parquet file", _short(f"{type(exc).__name__}: {exc}", 200))
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
