"""Rollout engines: sample n responses per prompt, chosen by name (actor_rollout_ref.rollout.name).

    engine = make_engine("hf", model, tokenizer, cfg.actor_rollout_ref.rollout)
    batch = engine.generate(prompts, uids, ground_truths, n=4, max_new_tokens=256,
                            sampling=SamplingParams.from_config(rollout_cfg), seed=0)

The registry (registry.py: ``ENGINES``, ``engine_class``, ``engine_names``, ``register_engine``) is
the one list of valid engine names: the bundled engines registered here, those added with
``register_engine``, and those that installed packages declare as entry points.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from trainer.rollout.base import RolloutEngine
from trainer.rollout.fast_engine import FastRolloutEngine
from trainer.rollout.hf_engine import HFRolloutEngine
from trainer.rollout.registry import ENGINES, ENTRY_POINT_GROUP, engine_class, engine_names, register_engine
from trainer.rollout.requests import NonFiniteLogitsError, RowsRequest, SamplingParams
from trainer.rollout.responses import finalize_responses
from trainer.rollout.static_engine import StaticRolloutEngine
from trainer.rollout.vllm_engine import VLLMRolloutEngine  # imports vLLM only when an engine is built

if TYPE_CHECKING:
    from trainer.config.schema import RolloutConfig

for _engine in (HFRolloutEngine, StaticRolloutEngine, FastRolloutEngine, VLLMRolloutEngine):
    register_engine(_engine.name, _engine)
del _engine


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
