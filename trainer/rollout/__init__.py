"""Rollout engines: sample n responses per prompt, chosen by name (actor_rollout_ref.rollout.name).

    engine = make_engine("hf", model, tokenizer, cfg.actor_rollout_ref.rollout)
    batch = engine.generate(prompts, uids, ground_truths, n=4, max_new_tokens=256,
                            sampling=SamplingParams.from_config(rollout_cfg), seed=0)
"""

from __future__ import annotations

from typing import Any

from torch import nn

from trainer.config import RolloutConfig
from trainer.rollout.base import NonFiniteLogitsError, RolloutEngine, SamplingParams, finalize_responses
from trainer.rollout.fast_engine import FastRolloutEngine
from trainer.rollout.hf_engine import HFRolloutEngine
from trainer.rollout.static_engine import StaticRolloutEngine

ENGINES: dict[str, type[RolloutEngine]] = {
    HFRolloutEngine.name: HFRolloutEngine,
    StaticRolloutEngine.name: StaticRolloutEngine,
    FastRolloutEngine.name: FastRolloutEngine,
}


def register_engine(name: str, engine: type[RolloutEngine]) -> None:
    """Add an engine under ``name`` (a plugin's own engine, say); an existing name is an error."""
    if name in ENGINES:
        raise ValueError(f"rollout engine {name!r} is already registered ({ENGINES[name].__name__})")
    ENGINES[name] = engine


def make_engine(
    name: str, model: nn.Module, tokenizer: Any, config: RolloutConfig | None = None, **kwargs: Any
) -> RolloutEngine:
    """The engine registered under ``name``; ``kwargs`` go to its constructor (e.g. share_weights)."""
    if name not in ENGINES:
        raise ValueError(f"unknown rollout engine {name!r}; available: {', '.join(sorted(ENGINES))}")
    return ENGINES[name](model, tokenizer, config, **kwargs)


__all__ = [
    "ENGINES",
    "FastRolloutEngine",
    "HFRolloutEngine",
    "NonFiniteLogitsError",
    "RolloutEngine",
    "SamplingParams",
    "StaticRolloutEngine",
    "finalize_responses",
    "make_engine",
    "register_engine",
]
