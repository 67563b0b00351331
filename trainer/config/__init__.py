"""The trainer's configuration: VERL's dotted keys (schema), ``key=value`` overrides read as Hydra
reads them (overrides), and the start-up checks (validation). ``build_config`` puts them together.

    cfg = build_config(["data.train_batch_size=16", Override("trainer.nnodes", 2, "--rl-nodes")])
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

from trainer.config.overrides import (
    Override,
    apply_override,
    as_override,
    parse_literal,
    resolve_interpolations,
    split_override,
)
from trainer.config.schema import (
    KEY_TYPES,
    ActorConfig,
    ActorRolloutRefConfig,
    AlgorithmConfig,
    Config,
    ConfigError,
    DataConfig,
    FSDPConfig,
    KLControlConfig,
    ModelConfig,
    OptimConfig,
    PolicyLossConfig,
    RefConfig,
    RolloutConfig,
    TargetLengthsConfig,
    TrainerSection,
    UnsupportedConfigError,
    clip_ratios,
    closest_keys,
    get_value,
    known_keys,
    set_value,
)
from trainer.config.validation import (
    ACCEPTED_NO_EFFECT,
    FIXED_CHOICES,
    KNOWN_BUT_UNSUPPORTED,
    LOGGERS,
    MEMORY_FRACTION_KEY,
    ROLLOUT_KEY,
    SizeProblems,
    batch_size_problems,
    check_choice,
    check_names_of,
    choices,
    names_set,
    registry_of,
    settings_without_effect,
    supported_choices,
    validate,
)


def build_config(
    overrides: Iterable[str | Override] = (),
    base: Config | None = None,
    check_names: bool = True,
    check_sizes: bool = True,
) -> Config:
    """Defaults, then each override (``key=value`` text or an Override) in order, then validation
    (``check_names``, ``check_sizes``: see ``validate``)."""
    cfg = copy.deepcopy(base) if base is not None else Config()
    for item in overrides:
        apply_override(cfg, item)
    return validate(resolve_interpolations(cfg), check_names=check_names, check_sizes=check_sizes)


__all__ = [
    "ACCEPTED_NO_EFFECT",
    "FIXED_CHOICES",
    "KEY_TYPES",
    "KNOWN_BUT_UNSUPPORTED",
    "LOGGERS",
    "MEMORY_FRACTION_KEY",
    "ROLLOUT_KEY",
    "SizeProblems",
    "ActorConfig",
    "ActorRolloutRefConfig",
    "AlgorithmConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "FSDPConfig",
    "KLControlConfig",
    "ModelConfig",
    "OptimConfig",
    "Override",
    "PolicyLossConfig",
    "RefConfig",
    "RolloutConfig",
    "TargetLengthsConfig",
    "TrainerSection",
    "UnsupportedConfigError",
    "apply_override",
    "as_override",
    "batch_size_problems",
    "build_config",
    "check_choice",
    "check_names_of",
    "choices",
    "clip_ratios",
    "closest_keys",
    "get_value",
    "known_keys",
    "names_set",
    "parse_literal",
    "registry_of",
    "resolve_interpolations",
    "set_value",
    "settings_without_effect",
    "split_override",
    "supported_choices",
    "validate",
]
