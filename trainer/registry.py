"""A registry of named, pluggable pieces: the one list of a setting's valid names.

Rollout engines, advantage estimators, loss aggregations, KL estimators and controllers, policy
losses, target-length distributions and checkpointing policies are each chosen by a name in the
config. Each used to be a dict with a lookup function of its own, five wordings of the same error,
and a second wrapper in config validation to read its names. A ``Registry`` is that dict with the
one lookup every caller needs, so a name is registered once and everything else reads it:

    ADV_ESTIMATORS: Registry[AdvantageFn] = Registry("advantage estimator")

    @ADV_ESTIMATORS.register("grpo")
    def grpo(inp): ...

    ADV_ESTIMATORS["grpo"]    # the function
    ADV_ESTIMATORS["ppo"]     # UnknownNameError: unknown advantage estimator 'ppo'; valid names: grpo, ...
    ADV_ESTIMATORS.names()    # ("grpo", ...): registration order

Besides the registered names a registry may hold
- names known but refused (``refuse``): VERL accepts them, this trainer does not implement them;
  a lookup says why instead of "unknown", and config validation reports them as unsupported;
- an entry-point group (``entry_point_group``): names that installed packages declare, valid at
  once and imported only when looked up. A Ray worker is another process, where no ``register``
  call of the driver ran; an entry point is found by every process on its own.

It is a read-only ``Mapping`` (``in``, iteration over ``names()``, ``.get`` returning None for an
unknown name). This module imports nothing of the trainer, so any module can hold a registry
without an import cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, TypeVar, overload

T = TypeVar("T")
_NO_VALUE: Any = object()  # register(name) without a value: the decorator form


class UnknownNameError(ValueError, KeyError):
    """A name that a registry does not hold, or refuses; the message lists the valid names.

    A ValueError for callers that check a setting's value, a KeyError for code that treats the
    registry as the mapping it is (``Mapping.get``)."""

    def __str__(self) -> str:
        return str(self.args[0])  # KeyError's own str() would show the message in quotes


class Registry(Mapping[str, T]):
    """Names -> values of one kind (``kind`` names it in errors: "unknown {kind} {name!r}; ...").

    subclass_of: the values are classes, each checked to subclass it when registered or loaded.
    entry_point_group: the group whose entry points (``name = "package.module:attribute"``) add
    names, imported on their first lookup; a registered name wins over a declared one.
    """

    def __init__(self, kind: str, *, subclass_of: type | None = None, entry_point_group: str | None = None) -> None:
        self.kind = kind
        self.subclass_of = subclass_of
        self.entry_point_group = entry_point_group
        self._entries: dict[str, T] = {}
        self._refused: dict[str, str] = {}

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, value: T) -> T: ...

    def register(self, name: str, value: Any = _NO_VALUE) -> Any:
        """Add ``value`` under ``name`` and return it; without ``value``, a decorator that does.

        A name already registered is an error (ValueError); a refused one becomes valid."""
        if value is _NO_VALUE:

            def decorator(item: T) -> T:
                return self.register(name, item)

            return decorator
        if name in self._entries:
            held = self._entries[name]
            raise ValueError(f"{self.kind} {name!r} is already registered ({getattr(held, '__name__', repr(held))})")
        self._check(name, value, "")
        self._entries[name] = value
        self._refused.pop(name, None)
        return value

    def unregister(self, name: str) -> None:
        """Forget a registered (or loaded) ``name``: a test's or a plugin's clean-up; no error if absent."""
        self._entries.pop(name, None)

    def refuse(self, name: str, reason: str) -> None:
        """Know ``name`` without supporting it: a lookup raises UnknownNameError with ``reason``
        (phrased to follow "is not supported: ")."""
        self._refused[name] = reason

    def refused(self) -> dict[str, str]:
        """The names known but refused, with the reason of each."""
        return dict(self._refused)

    def names(self) -> tuple[str, ...]:
        """Every valid name: the registered ones in registration order, then those that the entry-point
        group declares and no one has looked up yet, sorted."""
        declared = sorted(name for name in self._declared() if name not in self._entries)
        return (*self._entries, *declared)

    def __getitem__(self, name: str) -> T:
        """The value of ``name``, a declared one imported (and checked) on its first lookup."""
        if name in self._entries:
            return self._entries[name]
        declared = self._declared().get(name)
        if declared is not None:
            value = declared.load()
            self._check(name, value, f" (entry point {declared.value!r} in {self.entry_point_group})")
            self._entries[name] = value
            return value
        valid = ", ".join(self.names())
        if name in self._refused:
            raise UnknownNameError(f"{self.kind} {name!r} is not supported: {self._refused[name]}; valid names: {valid}")
        raise UnknownNameError(f"unknown {self.kind} {name!r}; valid names: {valid}")

    def __contains__(self, name: object) -> bool:
        """Whether ``name`` is valid, without importing a declared one."""
        return name in self._entries or (isinstance(name, str) and name in self._declared())

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"

    def _declared(self) -> dict[str, EntryPoint]:
        """The entry-point group's names, read each time: a package installed since is seen."""
        if self.entry_point_group is None:
            return {}
        return {ep.name: ep for ep in entry_points(group=self.entry_point_group)}

    def _check(self, name: str, value: object, where: str) -> None:
        base = self.subclass_of
        if base is not None and not (isinstance(value, type) and issubclass(value, base)):
            raise TypeError(f"{self.kind} {name!r}{where}: expected a {base.__name__} subclass, got {value!r}")
