"""How a data set's problems are recorded and reported: one ``Problem`` per thing wrong, and the
``DatasetError`` message that lists them (field path, what was expected, what was found)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from trainer.data.schema import is_list_type, is_string_type

# Field names for problems that are not about one field of one row.
FILE_FIELD = "<file>"
TABLE_FIELD = "<table>"
ROW_FIELD = "<row>"

SHOWN_PROBLEMS = 5  # how many problems an error message spells out before "and N more"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a data set. ``row`` is None when it holds for the file or a whole column;
    ``column`` marks a problem with a column being there at all (it reads "column images: ...")."""

    row: int | None
    field: str
    expected: str
    found: str
    column: bool = False

    def __str__(self) -> str:
        if self.field == FILE_FIELD:
            where = "file"
        elif self.column:
            where = f"column {self.field}"
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


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING: Any = _Missing()  # a field absent from a row (None is a present null)


def shorten(text: str, limit: int = 60) -> str:
    """``text`` cut to ``limit`` characters, ending in "..." when cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_value(value: Any) -> str:
    """How a found value reads in a problem: its type and a short repr."""
    if value is MISSING:
        return "missing"
    if value is None:
        return "null"
    if isinstance(value, str):
        return shorten(repr(value)) if value else "an empty string"
    return f"{type(value).__name__} {shorten(repr(value))}"


def describe_type(t: pa.DataType) -> str:
    """A schema type in the words problems use: string, int64, list<struct{role, content}>."""
    if is_string_type(t):
        return "string"
    if pa.types.is_integer(t):
        return "int64"
    if is_list_type(t):
        return f"list<{describe_type(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct{" + ", ".join(t.field(i).name for i in range(t.num_fields)) + "}"
    return str(t)
