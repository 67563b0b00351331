"""What the trainer supports, and the start-up checks of a whole config.

The valid names of a pluggable piece (rollout engine, advantage estimator, loss aggregation, KL
estimator and controller, policy loss, target-length distribution, checkpointing policy) are read
from its registry (trainer.registry.Registry) when a config is validated, so registering a new one
makes it valid here with no second list to update; a name the registry refuses is reported as not
supported, with the registry's reason. The registries are imported inside ``registry_of``: they
import torch, which a config must load (and pass ``validate``'s cheap first pass) without. No module
of theirs imports this package but for type checking (the engines take the config's types from
trainer.config.schema), so reading them makes no import cycle. Choices without a registry stay as
tables below.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainer.config.schema import KEY_TYPES, Config, ConfigError, UnsupportedConfigError, get_value

if TYPE_CHECKING:
    from trainer.registry import Registry

ROLLOUT_KEY = "actor_rollout_ref.rollout.name"
TARGET_LENGTHS_KEY = "actor_rollout_ref.rollout.target_lengths.distribution"
CHECKPOINT_POLICY_KEY = "actor_rollout_ref.model.gradient_checkpointing_policy"
CHECKPOINT_LAYERS_KEY = "actor_rollout_ref.model.gradient_checkpointing_layers"
MEMORY_FRACTION_KEY = "actor_rollout_ref.rollout.gpu_memory_utilization"
TP_KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"
_DTYPES = ("auto", "fp32", "bf16", "fp16")
# Choices that no registry lists (plain settings of this trainer or of VERL's ppo_trainer.yaml).
FIXED_CHOICES: dict[str, tuple[str, ...]] = {
    "data.truncation": ("error", "left", "right", "middle"),
    "data.synthetic_difficulty": ("tiny", "easy", "standard", "hard"),
    "actor_rollout_ref.actor.strategy": ("auto", "fsdp2", "dp"),
    "trainer.device": ("cpu", "cuda"),
    "trainer.resume_mode": ("disable", "auto", "resume_path"),
    "actor_rollout_ref.actor.fsdp_config.model_dtype": _DTYPES,
    "actor_rollout_ref.ref.fsdp_config.model_dtype": _DTYPES,
}
# Values that VERL accepts and this trainer does not implement (yet): an explicit error, not a guess.
# A name here is refused even when its registry has it (gae: the estimator exists, the critic not);
# a registry's own refusals (Registry.refuse, e.g. the "full" KL) are added to these.
KNOWN_BUT_UNSUPPORTED: dict[str, dict[str, str]] = {
    ROLLOUT_KEY: {
        "sglang": "the SGLang engine is not bundled",
    },
    "actor_rollout_ref.actor.strategy": {
        "fsdp": "FSDP1 is not used here; fsdp2 is",
        "megatron": "the Megatron back end is not bundled",
    },
    "algorithm.adv_estimator": {"gae": "GAE needs a critic worker, which this trainer does not have yet"},
}
LOGGERS: tuple[str, ...] = ("console", "tensorboard")
# Keys accepted for compatibility that change nothing here; a run that sets one is told so
# (settings_without_effect).
ACCEPTED_NO_EFFECT: dict[str, str] = {
    TP_KEY: "this engine runs data-parallel, one engine per worker; rollout.name=fast decodes "
    "tensor-parallel, and rollout.name=vllm checks it is 1",
    MEMORY_FRACTION_KEY: "the rollout KV cache is sized from the batch, except with "
    "rollout.name=vllm, whose engine it sizes",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "sequence parallelism is not implemented; must be 1 on one worker",
    "trainer.critic_warmup": "no critic",
    "trainer.val_before_train": "validation is not run",
    "trainer.test_freq": "validation is not run",
    "data.val_files": "validation is not run",
}


def settings_without_effect(cfg: Config) -> list[str]:
    """One line per key of ``ACCEPTED_NO_EFFECT`` that ``cfg`` sets away from its default, saying so:
    such a key is accepted so that a VERL command line runs as it is, and its value changes nothing.
    The memory fraction is left out for an engine that sizes itself from it (``uses_memory_fraction``)."""
    default = Config()
    engine = registry_of(ROLLOUT_KEY).get(cfg.actor_rollout_ref.rollout.name)  # None: not validated, unknown
    lines = []
    for key, why in ACCEPTED_NO_EFFECT.items():
        if key == MEMORY_FRACTION_KEY and engine is not None and engine.uses_memory_fraction:
            continue
        if key == TP_KEY and engine is not None and engine.supports_tensor_parallel:
            continue
        value = get_value(cfg, key)
        if value != get_value(default, key):
            lines.append(f"{key}={value} has no effect here: {why}")
    return lines


# ----------------------------------------------------------------------------- registries
# Where each registry lives (module, attribute): ``registry_of`` imports only the one asked for, so a
# check of the estimator does not pay for the rollout engines' transformers import.
REGISTRIES: dict[str, tuple[str, str]] = {
    ROLLOUT_KEY: ("trainer.rollout.registry", "ENGINES"),
    TARGET_LENGTHS_KEY: ("trainer.rollout.target_lengths", "DISTRIBUTIONS"),
    CHECKPOINT_POLICY_KEY: ("trainer.models.checkpointing", "POLICIES"),
    "algorithm.adv_estimator": ("trainer.algorithms.advantages", "ADV_ESTIMATORS"),
    "actor_rollout_ref.actor.loss_agg_mode": ("trainer.algorithms.aggregation", "LOSS_AGG_MODES"),
    "actor_rollout_ref.actor.policy_loss.loss_mode": ("trainer.algorithms.policy_loss", "POLICY_LOSSES"),
    "actor_rollout_ref.actor.kl_loss_type": ("trainer.algorithms.kl", "KL_ESTIMATORS"),
    "algorithm.kl_penalty": ("trainer.algorithms.kl", "KL_ESTIMATORS"),
    "algorithm.kl_ctrl.type": ("trainer.algorithms.kl", "KL_CONTROLLERS"),
}


def registry_of(key: str) -> Registry[Any]:
    """The registry that lists the valid values of ``key`` (KeyError for a key without one)."""
    module, attribute = REGISTRIES[key]
    registry: Registry[Any] = getattr(importlib.import_module(module), attribute)
    return registry


def names_set(cfg: Config) -> list[str]:
    """The registry-held keys that ``cfg`` sets away from the trainer's defaults, in CHOICE_KEYS order:
    the names a session checks at once (``check_names_of``; reading a registry imports torch), while
    the defaults, valid by construction, cost nothing."""
    default = Config()
    return [
        key for key in CHOICE_KEYS if key in REGISTRIES and get_value(cfg, key) != get_value(default, key)
    ]


def check_names_of(cfg: Config, keys: list[str]) -> None:
    """Check the registry-held ``keys`` of ``cfg`` (each registry imported alone), and with the rollout
    engine among them that engine's own start-up checks."""
    for key in keys:
        check_choice(key, get_value(cfg, key))
    if ROLLOUT_KEY in keys:
        _check_rollout_engine(cfg)


# The order in which validate checks the choice keys (the first bad one is reported).
CHOICE_KEYS: tuple[str, ...] = (
    "data.truncation",
    "data.synthetic_difficulty",
    ROLLOUT_KEY,
    TARGET_LENGTHS_KEY,
    "actor_rollout_ref.actor.strategy",
    CHECKPOINT_POLICY_KEY,
    "algorithm.adv_estimator",
    "actor_rollout_ref.actor.loss_agg_mode",
    "actor_rollout_ref.actor.policy_loss.loss_mode",
    "actor_rollout_ref.actor.kl_loss_type",
    "algorithm.kl_penalty",
    "algorithm.kl_ctrl.type",
    "trainer.device",
    "trainer.resume_mode",
    "actor_rollout_ref.actor.fsdp_config.model_dtype",
    "actor_rollout_ref.ref.fsdp_config.model_dtype",
)


def choices(key: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """The supported values of ``key`` (its table's or its registry's), and those known but
    unsupported with the reason. KeyError for a key that takes any value."""
    unsupported = dict(KNOWN_BUT_UNSUPPORTED.get(key, {}))
    if key in FIXED_CHOICES:
        names = FIXED_CHOICES[key]
    else:
        names = (known := registry_of(key)).names()
        unsupported.update(known.refused())
    return tuple(n for n in names if n not in unsupported), unsupported


def supported_choices(key: str) -> tuple[str, ...]:
    """The values of ``key`` this trainer runs, e.g. the registered rollout engines."""
    return choices(key)[0]


def check_choice(key: str, value: object, shown: str | None = None, invalid: str = "is not valid") -> None:
    """Raise UnsupportedConfigError (known, not implemented) or ConfigError naming the valid values.

    ``shown``: how the message names the setting (default ``key``; an option's flag, say)."""
    shown = key if shown is None else shown
    supported, unsupported = choices(key)
    if value in unsupported:
        raise UnsupportedConfigError(
            f"{shown}={value} is not supported yet: {unsupported[value]}; supported: {', '.join(supported)}"
        )
    if value not in supported:
        raise ConfigError(f"{shown}={value!r} {invalid}; choose one of: {', '.join(supported)}")


# ----------------------------------------------------------------------------- validation
def _check_rollout_engine(cfg: Config) -> None:
    """The chosen engine's own start-up checks (``RolloutEngine.check_config``, e.g. the vllm engine:
    vLLM installed, one engine per worker), found through the engine registry."""
    registry_of(ROLLOUT_KEY)[cfg.actor_rollout_ref.rollout.name].check_config(cfg)


# ----------------------------------------------------------------------------- sizes
BATCH_KEY = "data.train_batch_size"
MINI_KEY = "actor_rollout_ref.actor.ppo_mini_batch_size"
N_KEY = "actor_rollout_ref.rollout.n"
# Sizes and counts that must be at least 1. The micro-batch sizes have no relation to the others: a
# worker's last micro-batch may be smaller than the rest.
POSITIVE_KEYS: tuple[str, ...] = (
    BATCH_KEY,
    "data.max_prompt_length",
    "data.max_response_length",
    N_KEY,
    MINI_KEY,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.actor.ppo_epochs",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "trainer.nnodes",
    "trainer.n_gpus_per_node",
    TP_KEY,
    "trainer.total_epochs",
)


def positive_problems(cfg: Config) -> list[str]:
    """One line per key of POSITIVE_KEYS below 1."""
    return [
        f"{key} must be at least 1, got {get_value(cfg, key)}"
        for key in POSITIVE_KEYS
        if get_value(cfg, key) < 1
    ]


@dataclass(frozen=True)
class SizeProblems:
    """The violated relations between the batch sizes, each saying what would fix it, and ``fix``:
    values that fix them all together (or why none exist). Empty (false) when none is violated."""

    problems: tuple[str, ...] = ()
    fix: str = ""

    def __bool__(self) -> bool:
        return bool(self.problems)

    def message(self) -> str:
        """One message: the fix first (what to do), then each problem on a line of its own."""
        return f"the batch sizes do not fit ({self.fix}):\n  - " + "\n  - ".join(self.problems)


def batch_size_problems(
    cfg: Config,
    prompts: int | None = None,
    source: str = "the data set",
    workers: int | None = -1,
    unit: str = "usable prompt(s)",
) -> SizeProblems:
    """Every violated relation between the batch sizes, checked together. The sizes must be at least 1
    (``positive_problems``).

    prompts: the data set's usable prompts (``source`` names the set, ``unit`` what was counted: its rows
    are an upper bound), None where they are not known;
    workers: the data-parallel workers the responses split over (by default the config's world size),
    None where the GPU count is not known yet (the cluster tells it)."""
    batch, mini = cfg.data.train_batch_size, cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    n = cfg.actor_rollout_ref.rollout.n
    workers = cfg.world_size if workers == -1 else workers
    most = batch if prompts is None else min(batch, prompts)
    fit = fitting_sizes(most, mini, n, workers or 1)
    mini_fix = f"e.g. set {MINI_KEY} to {fit[1]}" if fit else "no mini-batch size fits"
    problems = []
    if prompts is not None and batch > prompts:
        problems.append(
            f"{BATCH_KEY} ({batch}) is larger than {source}, which has {prompts} {unit}: a step could "
            f"never fill its batch; set {BATCH_KEY} to at most {prompts}"
        )
    if mini > batch:
        problems.append(f"{MINI_KEY} ({mini}) must not exceed {BATCH_KEY} ({batch}); {mini_fix}")
    elif batch % mini:
        problems.append(f"{BATCH_KEY} ({batch}) must be a multiple of {MINI_KEY} ({mini}); {mini_fix}")
    if workers and mini * n % workers:
        problems.append(
            f"ppo_mini_batch_size x rollout.n = {mini} x {n} = {mini * n} responses must split evenly over "
            f"{workers} workers (trainer.nnodes x trainer.n_gpus_per_node): {MINI_KEY} must be a multiple of "
            f"{workers // math.gcd(n, workers)}"
        )
    if not problems:
        return SizeProblems()
    if fit is None:
        fix = (
            f"no {BATCH_KEY} up to {most} has a mini-batch size whose {n} responses per prompt split evenly "
            f"over {workers} workers: raise {N_KEY}, or use fewer workers"
        )
    else:
        changed = ((BATCH_KEY, fit[0], batch), (MINI_KEY, fit[1], mini))
        fix = "values that work together: " + " ".join(
            f"{key}={new}" for key, new, old in changed if new != old
        )
    return SizeProblems(tuple(problems), fix)


def fitting_sizes(most: int, mini: int, n: int, workers: int) -> tuple[int, int] | None:
    """(train batch size, mini-batch size) that fit together: the largest batch size up to ``most``
    that has a fitting mini-batch size, and of those the one nearest ``mini`` (the largest not above
    it, else the smallest). A mini-batch size fits when it divides the batch size and its ``n``
    responses per prompt split evenly over ``workers``. None when no batch size up to ``most`` has one."""
    step = workers // math.gcd(n, workers)  # mini-batch sizes whose responses split evenly: its multiples
    for batch in range(most, 0, -1):
        fitting = [m for m in range(step, batch + 1, step) if batch % m == 0]
        if fitting:
            below = [m for m in fitting if m <= mini]
            return batch, below[-1] if below else fitting[0]
    return None


def _check_target_lengths(cfg: Config) -> None:
    """rollout.target_lengths: a mean in (0, max_response_length] and sigma >= 0 when targets are on."""
    targets = cfg.actor_rollout_ref.rollout.target_lengths
    prefix = "actor_rollout_ref.rollout.target_lengths"
    if not targets.sigma >= 0:
        raise ConfigError(f"{prefix}.sigma must be >= 0, got {targets.sigma}")
    if targets.slowest_of < 0:
        raise ConfigError(f"{prefix}.slowest_of must be >= 0 (0: off), got {targets.slowest_of}")
    if targets.gpus_per_share < 1:
        raise ConfigError(f"{prefix}.gpus_per_share must be >= 1, got {targets.gpus_per_share}")
    if targets.distribution == "none":
        if targets.slowest_of:
            raise ConfigError(
                f"{prefix}.slowest_of={targets.slowest_of} needs drawn lengths: set {prefix}.distribution "
                f"to a distribution, not none"
            )
        return
    _check_slowest_of(cfg, targets.slowest_of)
    cap = cfg.data.max_response_length
    if not 0 < targets.mean <= cap:
        raise ConfigError(
            f"{prefix}.mean must be in (0, data.max_response_length={cap}] tokens for "
            f"distribution={targets.distribution}, got {targets.mean}"
        )
    if targets.distribution == "lognormal" and targets.sigma > 0 and targets.mean >= cap:
        # a spread-out law capped at the cap has a mean below it
        raise ConfigError(
            f"{prefix}.mean must be below data.max_response_length={cap} for a log-normal with sigma > 0, "
            f"got {targets.mean}"
        )


def _check_slowest_of(cfg: Config, shares: int) -> None:
    """rollout.target_lengths.slowest_of: whole shares over the workers, fewer than the run replayed had,
    and a step's prompts whole per worker."""
    if not shares:
        return
    prefix = "actor_rollout_ref.rollout.target_lengths"
    key, workers, prompts = f"{prefix}.slowest_of", cfg.world_size, cfg.data.train_batch_size
    per = cfg.actor_rollout_ref.rollout.target_lengths.gpus_per_share
    if workers % per:
        raise ConfigError(
            f"{prefix}.gpus_per_share={per} must divide this run's {workers} worker(s): each share is split over that many"
        )
    if shares <= workers // per:
        raise ConfigError(
            f"{key}={shares} (the shares of the run replayed; 0: off) must exceed the {workers // per} share(s) "
            f"this run's {workers} worker(s) generate"
        )
    if prompts % workers:
        raise ConfigError(
            f"{key}={shares} needs data.train_batch_size ({prompts}) to be a multiple of the {workers} worker(s): "
            f"each worker generates the same number of prompts"
        )


def _finite(cfg: Config) -> None:
    """Every float key (and each float of a list key such as optim.betas) is a finite number: a NaN
    learning rate or an infinite KL coefficient would make every update a silent no-op while still timed."""
    for key in KEY_TYPES:
        value = get_value(cfg, key)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, float) and not math.isfinite(item):
                raise ConfigError(f"{key} must be a finite number, got {value}")


def _check_liger(cfg: Config) -> None:
    """use_liger needs liger-kernel's Triton kernels: a CUDA device and the package, checked before any work."""
    if not cfg.actor_rollout_ref.model.use_liger:
        return
    from trainer.models.liger import LIGER_EXTRA, liger_installed

    if cfg.trainer.device != "cuda":
        raise UnsupportedConfigError(
            "actor_rollout_ref.model.use_liger=True needs trainer.device=cuda (liger-kernel's kernels are "
            f"Triton GPU kernels); got trainer.device={cfg.trainer.device}"
        )
    if not liger_installed():
        raise UnsupportedConfigError(
            f"actor_rollout_ref.model.use_liger=True needs liger-kernel: {LIGER_EXTRA}"
        )


def _check_checkpoint_policy(cfg: Config) -> None:
    """A selective policy shapes the checkpointed recompute, so it needs checkpointing on: refused, not
    ignored, when it is off (a run would silently keep every activation); and not with use_liger where
    the policy would keep a tensor liger's kernels overwrite."""
    model = cfg.actor_rollout_ref.model
    layers = model.gradient_checkpointing_layers
    if layers is not None:
        if not model.enable_gradient_checkpointing:
            raise ConfigError(
                f"{CHECKPOINT_LAYERS_KEY}={layers} needs actor_rollout_ref.model.enable_gradient_checkpointing=True "
                "(it chooses how many layers are checkpointed); found False"
            )
        if layers < 1:
            raise ConfigError(
                f"{CHECKPOINT_LAYERS_KEY} must be null (every layer) or at least 1, got {layers} (to checkpoint "
                "no layer, set actor_rollout_ref.model.enable_gradient_checkpointing=False)"
            )
    policy = model.gradient_checkpointing_policy
    if policy == "full":
        return
    if not model.enable_gradient_checkpointing:
        raise ConfigError(
            f"{CHECKPOINT_POLICY_KEY}={policy} needs actor_rollout_ref.model.enable_gradient_checkpointing=True "
            "(the policy chooses what the checkpointed recompute skips); found False"
        )
    if model.use_liger:
        from trainer.models.checkpointing import UNSAFE_WITH_LIGER

        if policy in UNSAFE_WITH_LIGER:
            raise UnsupportedConfigError(
                f"{CHECKPOINT_POLICY_KEY}={policy} is not supported with actor_rollout_ref.model.use_liger=True: "
                f"{UNSAFE_WITH_LIGER[policy]}; use save_attention or full"
            )


def validate(cfg: Config, check_names: bool = True, check_sizes: bool = True) -> Config:
    """Cross-field checks VERL makes at start-up, with messages that say what would be valid.

    check_names False leaves out the keys whose valid names come from a registry (reading one imports
    torch), but for the names known and refused (KNOWN_BUT_UNSUPPORTED, a plain table): a cheap first
    pass, for a caller that checks the names later, before any work starts. check_sizes False leaves
    out the batch sizes' relations (``batch_size_problems``), for a caller that checks them with the
    data set's size, as the session does."""
    for key in CHOICE_KEYS:
        if check_names or key in FIXED_CHOICES:
            check_choice(key, get_value(cfg, key))
        elif (value := get_value(cfg, key)) in KNOWN_BUT_UNSUPPORTED.get(key, {}):
            # refused from the table alone: listing the supported names would read the registry (torch)
            raise UnsupportedConfigError(
                f"{key}={value} is not supported yet: {KNOWN_BUT_UNSUPPORTED[key][value]}"
            )
    _finite(cfg)
    if check_names:
        _check_rollout_engine(cfg)
    for name in cfg.trainer.logger:
        if name not in LOGGERS:
            raise UnsupportedConfigError(
                f"trainer.logger {name!r} is not supported; available: {', '.join(LOGGERS)}"
            )
    problems = positive_problems(cfg)
    if problems:
        raise ConfigError("; ".join(problems))
    sizes = batch_size_problems(cfg) if check_sizes else SizeProblems()
    if sizes:
        raise ConfigError(sizes.message())
    actor = cfg.actor_rollout_ref.actor
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.temperature <= 0:
        raise ConfigError(f"actor_rollout_ref.rollout.temperature must be > 0, got {rollout.temperature}")
    if not 0.0 < rollout.top_p <= 1.0:
        raise ConfigError(f"actor_rollout_ref.rollout.top_p must be in (0, 1], got {rollout.top_p}")
    _check_target_lengths(cfg)
    if cfg.data.synthetic_prompt_length < 0:
        raise ConfigError(
            f"data.synthetic_prompt_length must be >= 0 (0: natural lengths), got {cfg.data.synthetic_prompt_length}"
        )
    if not 0.0 <= actor.clip_ratio < 1.0:
        raise ConfigError(f"actor_rollout_ref.actor.clip_ratio must be in [0, 1), got {actor.clip_ratio}")
    if actor.ulysses_sequence_parallel_size != 1:
        raise UnsupportedConfigError(
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size="
            f"{actor.ulysses_sequence_parallel_size} is not supported yet: sequence parallelism is not "
            "implemented; use 1"
        )
    _check_checkpoint_policy(cfg)  # before _check_liger: a conflict of keys, whatever the device
    _check_liger(cfg)
    keep = cfg.trainer.max_actor_ckpt_to_keep
    if keep is not None and keep < 1:
        raise ConfigError(f"trainer.max_actor_ckpt_to_keep must be null (keep all) or at least 1, got {keep}")
    if cfg.trainer.resume_mode == "resume_path" and not cfg.trainer.resume_from_path:
        raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path")
    return cfg
