"""The rollout engine registry: the valid actor_rollout_ref.rollout.name values and their classes.

    engine_class("fast").accepts_sharded_model   # an engine's traits, read from its class
    engine_names()                                # ("hf", "static", "fast", "vllm", ...declared)

The list holds the bundled engines (registered by trainer/rollout/__init__.py, which Python runs
before this module whenever it is imported), those added with ``register_engine``, and those that
installed packages declare in the entry-point group ``pytest_rlbench.rollout_engines``
(``name = "package.module:EngineClass"``), imported on first lookup. ``register_engine`` reaches only
the process that calls it; a Ray worker is another process, so an engine that the trainer's workers
must build is declared as an entry point, which every process finds on its own.

This module imports no engine: config validation reads it, and the engines import the config's
types, so the registry sits between them and neither imports the other.
"""

from __future__ import annotations

from trainer.registry import Registry
from trainer.rollout.base import RolloutEngine

ENTRY_POINT_GROUP = "pytest_rlbench.rollout_engines"

ENGINES: Registry[type[RolloutEngine]] = Registry(
    "rollout engine", subclass_of=RolloutEngine, entry_point_group=ENTRY_POINT_GROUP
)
engine_class = ENGINES.__getitem__  # the class of a valid name (a declared one imported); UnknownNameError else
engine_names = ENGINES.names  # every valid name: registered in order, then declared ones, sorted
register_engine = ENGINES.register  # register_engine(name, EngineClass), or @register_engine(name)
