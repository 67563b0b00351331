"""trainer.registry.Registry (one lookup and one error for every named piece) and the rollout
engines' traits read through it. The trainer's import graph without a cycle: tests/test_architecture.py."""

from __future__ import annotations

import pytest

from trainer.registry import Registry, UnknownNameError


def things() -> Registry[object]:
    registry: Registry[object] = Registry("thing")
    registry.register("a", 1)

    @registry.register("b")
    def b() -> None: ...

    return registry


def test_names_in_registration_order_by_call_or_decorator():
    registry = things()
    assert registry.names() == ("a", "b") == tuple(registry)
    assert registry["a"] == 1 and registry["b"].__name__ == "b"
    assert "a" in registry and "c" not in registry and len(registry) == 2


def test_an_unknown_name_is_a_value_and_key_error_listing_the_valid_names():
    registry = things()
    with pytest.raises(UnknownNameError, match=r"^unknown thing 'c'; valid names: a, b$") as caught:
        registry["c"]
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, KeyError)
    assert registry.get("c") is None  # the Mapping's get


def test_a_name_is_registered_once_and_can_be_forgotten():
    registry = things()
    with pytest.raises(ValueError, match=r"thing 'a' is already registered \(1\)"):
        registry.register("a", 2)
    registry.unregister("a")
    registry.unregister("a")  # absent: nothing to do
    assert registry.names() == ("b",)


def test_a_refused_name_says_why_until_it_is_registered():
    registry = things()
    registry.refuse("z", "needs a critic")
    assert registry.refused() == {"z": "needs a critic"} and "z" not in registry
    with pytest.raises(UnknownNameError, match=r"^thing 'z' is not supported: needs a critic; valid names: a, b$"):
        registry["z"]
    registry.register("z", 3)
    assert registry["z"] == 3 and registry.refused() == {}


def test_a_registry_of_classes_takes_subclasses_only():
    registry: Registry[type[LookupError]] = Registry("error kind", subclass_of=LookupError)
    registry.register("key", KeyError)
    with pytest.raises(TypeError, match="error kind 'three': expected a LookupError subclass, got 3"):
        registry.register("three", 3)  # type: ignore[arg-type]


def test_engine_traits_are_class_attributes_read_through_the_registry():
    from trainer.config import Config
    from trainer.rollout import RolloutEngine, engine_class, engine_names

    bundled = ("hf", "static", "fast", "vllm")
    assert [n for n in bundled if engine_class(n).accepts_sharded_model] == ["fast"]
    assert [n for n in bundled if engine_class(n).uses_memory_fraction] == ["vllm"]
    assert set(bundled) <= set(engine_names())
    RolloutEngine.check_config(Config())  # the default start-up check: none

