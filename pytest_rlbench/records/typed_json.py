"""JSON documents to and from annotated dataclasses, with every problem named by its JSON path.

One generic walk over a dataclass's type hints checks types, bounds, missing and unknown fields, and
collects all the problems (``$.phases.gen.seconds[1]: expected a number > 0, found -3``) instead of
stopping at the first. Field metadata understood here:

- ``SAMPLES``: a number or a non-empty list of numbers, written back as a plain number when it holds one;
- ``{"gt": x}`` / ``{"ge": x}`` / ``{"lt": x}`` / ``{"le": x}``: numeric bounds, applied to every
  number inside the field;
- ``{"omit_default": True}``: left out of the JSON while it holds its default.

Types used: int, float, bool, str, Any, Optional[X], list[X], dict[str, X] and nested dataclasses.
Every integer must fit in 64 bits and every float must be finite, whatever the field's bounds.

``load_json_file`` reads a document with limits (size, nesting depth, UTF-8), so a hostile or broken
file is one ``JSONFileError`` naming the problem, never a RecursionError or UnicodeDecodeError.
"""

from __future__ import annotations

import json
import math
import typing
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from types import NoneType, UnionType
from typing import Any

MAX_FILE_BYTES = 16 * 1024 * 1024  # a baseline is a few kilobytes; this is generous
MAX_DEPTH = 64  # the record format nests five levels deep
INT_LIMIT = 2**63  # integers as a C int64 holds them (counts, sizes)

SAMPLES: dict[str, Any] = {"samples": True}
POSITIVE: dict[str, Any] = {"gt": 0}
NON_NEGATIVE: dict[str, Any] = {"ge": 0}


def describe(value: Any) -> str:
    """A JSON value as an error message names it: "number -3", "an array"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {json.dumps(value)}"
    if isinstance(value, int) and abs(value) >= INT_LIMIT:
        return f"an integer of {len(str(abs(value)))} digits"
    if isinstance(value, int | float):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {value!r}"
    return "an array" if isinstance(value, list) else "an object"


def _bound_problem(value: float, meta: typing.Mapping[str, Any]) -> str | None:
    if "gt" in meta and not value > meta["gt"]:
        return f"expected a number > {meta['gt']}, found {value!r}"
    if "ge" in meta and not value >= meta["ge"]:
        return f"expected a number >= {meta['ge']}, found {value!r}"
    if "lt" in meta and not value < meta["lt"]:
        return f"expected a number < {meta['lt']}, found {value!r}"
    if "le" in meta and not value <= meta["le"]:
        return f"expected a number <= {meta['le']}, found {value!r}"
    return None


def _is_number(value: Any) -> bool:
    """A JSON number this format can hold: an int64 or a finite float (10**400 is neither)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return abs(value) < INT_LIMIT if isinstance(value, int) else math.isfinite(value)


def _parse_value(tp: Any, value: Any, path: str, problems: list[str], meta: typing.Mapping[str, Any]) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, UnionType):  # only Optional[X] is used
        if value is None:
            return None
        tp = next(a for a in args if a is not NoneType)
        origin, args = typing.get_origin(tp), typing.get_args(tp)
    if is_dataclass(tp):
        return parse_dataclass(tp, value, path, problems)
    if origin is list:
        if meta.get("samples") and isinstance(value, int | float) and not isinstance(value, bool):
            value = [value]  # a single sample may be written as a plain number
        if not isinstance(value, list) or (meta.get("samples") and not value):
            what = "a number or a non-empty array of numbers" if meta.get("samples") else "an array"
            problems.append(f"{path}: expected {what}, found {describe(value)}")
            return None
        return [_parse_value(args[0], v, f"{path}[{i}]", problems, meta) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            problems.append(f"{path}: expected an object, found {describe(value)}")
            return None
        return {k: _parse_value(args[1], v, f"{path}.{k}", problems, meta) for k, v in value.items()}
    return _parse_scalar(tp, value, path, problems, meta)


def _parse_scalar(tp: Any, value: Any, path: str, problems: list[str], meta: typing.Mapping[str, Any]) -> Any:
    if tp is Any:
        return value
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and _is_number(value)
    elif tp is float:
        ok = _is_number(value)
    else:
        ok = isinstance(value, tp)
    if not ok:
        name = {bool: "a boolean", int: "an integer", float: "a finite number", str: "a string"}[tp]
        if tp is int and isinstance(value, int) and not isinstance(value, bool):
            name = "an integer of magnitude below 2**63"
        problems.append(f"{path}: expected {name}, found {describe(value)}")
        return None
    if tp in (int, float):
        bound = _bound_problem(value, meta)
        if bound:
            problems.append(f"{path}: {bound}")
        return float(value) if tp is float else value
    return value


def parse_dataclass(cls: type, data: Any, path: str, problems: list[str]) -> Any:
    """An instance of ``cls`` from ``data``, or None; each problem is appended to ``problems``."""
    if not isinstance(data, dict):
        problems.append(f"{path}: expected an object, found {describe(data)}")
        return None
    hints = typing.get_type_hints(cls)
    names = [f.name for f in fields(cls)]
    for key in data:
        if key not in names:
            problems.append(f"{path}.{key}: unknown field; expected one of: {', '.join(names)}")
    kwargs = {}
    for f in fields(cls):
        if f.name in data:
            kwargs[f.name] = _parse_value(hints[f.name], data[f.name], f"{path}.{f.name}", problems, f.metadata)
        elif f.default is MISSING and f.default_factory is MISSING:
            problems.append(f"{path}.{f.name}: required field missing")
    try:
        return cls(**kwargs)
    except TypeError:  # a required field was missing: already reported
        return None


def to_json(value: Any, meta: typing.Mapping[str, Any] | None = None) -> Any:
    """A dataclass (or a value inside one) as plain JSON values, fields in declaration order."""
    meta = meta or {}
    if is_dataclass(value):
        out = {}
        for f in fields(value):
            item = getattr(value, f.name)
            if f.metadata.get("omit_default") and item == f.default:
                continue
            out[f.name] = to_json(item, f.metadata)
        return out
    if isinstance(value, dict):
        return {k: to_json(v, meta) for k, v in value.items()}
    if isinstance(value, list):
        if meta.get("samples") and len(value) == 1:
            return value[0]
        return [to_json(v) for v in value]
    return value


class JSONFileError(ValueError):
    """A file that is not a JSON document this package reads; the message says why."""


def _depth(data: Any) -> int:
    """The nesting depth of a decoded document, walked without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        deepest = max(deepest, depth)
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        stack.extend((child, depth + 1) for child in children)
    return deepest


def load_json_file(path: Path) -> Any:
    """A JSON document read from ``path``: UTF-8, at most MAX_FILE_BYTES, nested at most MAX_DEPTH.

    OSError if the file cannot be read; JSONFileError for anything else wrong with it."""
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise JSONFileError(f"the file is {size} bytes; a record is at most {MAX_FILE_BYTES}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JSONFileError(f"not UTF-8 text: byte {raw[exc.start]:#04x} at offset {exc.start}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise JSONFileError(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise JSONFileError(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # e.g. an integer past Python's digit limit for int()
        raise JSONFileError(f"not valid JSON: {exc}") from None
    if _depth(data) > MAX_DEPTH:
        raise JSONFileError(f"nested deeper than {MAX_DEPTH} levels")
    return data
