"""``key=value`` overrides: read the way Hydra reads a command line, checked against the schema.

``true``/``False`` are booleans, ``1e-6`` a float, ``["console","tensorboard"]`` a list, ``'error'`` a
quoted string, ``null`` None (Hydra's override grammar, hydra.cc "Override grammar/Basic"). An unknown
key is an error naming the closest valid keys; a value of the wrong type names the key and the value.
"""

from __future__ import annotations

import ast
import types
import typing
from dataclasses import dataclass
from typing import Any

from trainer.config.schema import (
    KEY_TYPES,
    Config,
    ConfigError,
    closest_keys,
    get_value,
    known_keys,
    set_value,
)


@dataclass(frozen=True)
class Override:
    """One setting and where it came from: the unit ``build_config`` applies, in order.

    ``value`` is what ``parse_literal`` reads from the text, or a typed value given by code (a path,
    a count), which then needs no quoting; ``source`` names the setting in messages (``--rl-nodes``)."""

    key: str
    value: Any
    source: str = "override"

    @classmethod
    def parse(cls, text: str, source: str = "override") -> Override:
        key, raw = split_override(text)
        return cls(key, parse_literal(raw), source)

    def __str__(self) -> str:
        return f"{self.key}={self.value}"


def parse_literal(text: str) -> Any:
    """Read a command-line value the way Hydra does (booleans, numbers, lists, quotes, null)."""
    s = text.strip()
    low = s.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none", "~"):
        return None
    if s.startswith("[") and s.endswith("]"):
        inner = s[1:-1].strip()
        if not inner:
            return []
        try:
            return list(ast.literal_eval(s))
        except (ValueError, SyntaxError):
            return [parse_literal(part) for part in inner.split(",")]  # [console,tensorboard]
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    for conv in (int, float):
        try:
            return conv(s)
        except ValueError:
            pass
    return s


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check ``value`` against the field's annotated type, converting where unambiguous."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(key, value, arg)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{key}: cannot read {value!r}")
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        items = value if isinstance(value, list) else [value]
        return [_coerce(key, v, item_tp) for v in items]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key} expects true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{key} expects an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} expects a number, got {value!r}")
        return float(value)
    if tp is str:
        if value is None or isinstance(value, (list, dict)):
            raise ConfigError(f"{key} expects a string, got {value!r}")
        return str(value)
    raise ConfigError(f"{key}: unsupported type {tp}")


def split_override(text: str) -> tuple[str, str]:
    """Split ``key=value``; raise ConfigError naming the malformed text otherwise."""
    key, sep, value = text.partition("=")
    key = key.strip().lstrip("+")  # Hydra's "+key=" (add) reads the same here
    if not sep or not key or any(c.isspace() for c in key):
        raise ConfigError(f"malformed override {text!r}: expected KEY=VALUE, e.g. data.train_batch_size=128")
    return key, value


def as_override(item: str | Override) -> Override:
    """An Override as is; ``key=value`` text parsed into one."""
    return item if isinstance(item, Override) else Override.parse(item)


def apply_override(cfg: Config, item: str | Override) -> None:
    """Set one key of ``cfg``: raise ConfigError for an unknown key or a value of the wrong type."""
    override = as_override(item)
    key = override.key
    if key not in KEY_TYPES:
        close = closest_keys(key)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"unknown config key {key!r}{hint}")
    set_value(cfg, key, _coerce(key, override.value, KEY_TYPES[key]))


def resolve_interpolations(cfg: Config) -> Config:
    """Expand ``${section.key}`` references in string values (as Hydra does for default_local_dir)."""
    for key in known_keys():
        value = get_value(cfg, key)
        if isinstance(value, str) and "${" in value:
            out = value
            for ref in known_keys():
                token = "${" + ref + "}"
                if token in out:
                    out = out.replace(token, str(get_value(cfg, ref)))
            if "${" in out:
                raise ConfigError(f"{key}={value!r} refers to an unknown key")
            set_value(cfg, key, out)
    return cfg
