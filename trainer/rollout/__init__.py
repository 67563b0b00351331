"""Rollout engines: sample n responses per prompt, chosen by name (actor_rollout_ref.rollout.name).

    engine = make_engine("hf", model, tokenizer, cfg.actor_rollout_ref.rollout)
    batch = engine.generate(prompts, uids, ground_truths, n=4, max_new_tokens=256,
                            sampling=SamplingParams.from_config(rollout_cfg), seed=0)

The registry is the one list of valid engine names (``engine_names``): the bundled engines, those
added with ``register_engine``, and those that installed packages declare in the entry-point group
``pytest_rlbench.rollout_engines`` (``name = "package.module:EngineClass"``). ``register_engine``
reaches only the process that calls it; a Ray worker is another process, so an engine that the
trainer's workers must build is declared as an entry point, which every process finds on its own.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import Any

from torch import nn

from trainer.config import RolloutConfig
from trainer.rollout.base import RolloutEngine
from trainer.rollout.fast_engine import FastRolloutEngine
from trainer.rollout.hf_engine import HFRolloutEngine
from trainer.rollout.requests import NonFiniteLogitsError, RowsRequest, SamplingParams
from trainer.rollout.responses import finalize_responses
from trainer.rollout.static_engine import StaticRolloutEngine
from trainer.rollout.vllm_engine import VLLMRolloutEngine  # imports vLLM only when an engine is built

ENTRY_POINT_GROUP = "pytest_rlbench.rollout_engines"

ENGINES: dict[str, type[RolloutEngine]] = {
    HFRolloutEngine.name: HFRolloutEngine,
    StaticRolloutEngine.name: StaticRolloutEngine,
    FastRolloutEngine.name: FastRolloutEngine,
    VLLMRolloutEngine.name: VLLMRolloutEngine,
}


def _declared_engines() -> dict[str, EntryPoint]:
    """Engines that installed packages declare as entry points, by name (not imported yet)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def engine_names() -> tuple[str, ...]:
    """Every valid engine name: the registered ones in registration order, then the declared ones
    (a declared name that is already registered is ignored: the registered engine wins)."""
    declared = sorted(name for name in _declared_engines() if name not in ENGINES)
    return (*ENGINES, *declared)


def register_engine(name: str, engine: type[RolloutEngine]) -> None:
    """Add an engine under ``name`` in this process (a plugin's own engine, say); an existing name
    is an error. Ray workers do not see it: declare an entry point for those (module docstring)."""
    if name in ENGINES:
        raise ValueError(f"rollout engine {name!r} is already registered ({ENGINES[name].__name__})")
    if not (isinstance(engine, type) and issubclass(engine, RolloutEngine)):
        raise TypeError(f"rollout engine {name!r}: expected a RolloutEngine subclass, got {engine!r}")
    ENGINES[name] = engine


def engine_class(name: str) -> type[RolloutEngine]:
    """The engine class registered or declared under ``name`` (a declared one is imported and registered)."""
    if name not in ENGINES:
        declared = _declared_engines().get(name)
        if declared is None:
            raise ValueError(f"unknown rollout engine {name!r}; available: {', '.join(sorted(engine_names()))}")
        loaded = declared.load()
        if not (isinstance(loaded, type) and issubclass(loaded, RolloutEngine)):
            raise TypeError(
                f"rollout engine {name!r} (entry point {declared.value!r} in {ENTRY_POINT_GROUP}): "
                f"expected a RolloutEngine subclass, got {loaded!r}"
            )
        ENGINES[name] = loaded
    return ENGINES[name]


def make_engine(
    name: str, model: nn.Module, tokenizer: Any, config: RolloutConfig | None = None, **kwargs: Any
) -> RolloutEngine:
    """The engine registered under ``name``; ``kwargs`` go to its constructor (e.g. share_weights)."""
    return engine_class(name)(model, tokenizer, config, **kwargs)


__all__ = [
    "ENGINES",
    "ENTRY_POINT_GROUP",
    "FastRolloutEngine",
    "HFRolloutEngine",
    "NonFiniteLogitsError",
    "RolloutEngine",
    "RowsRequest",
    "SamplingParams",
    "StaticRolloutEngine",
    "VLLMRolloutEngine",
    "engine_class",
    "engine_names",
    "finalize_responses",
    "make_engine",
    "register_engine",
]
