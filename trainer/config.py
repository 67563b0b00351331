"""The trainer's configuration, in VERL's dotted names and meanings.

Every key of the seed's command line (``../shared/seed``) is here with VERL's meaning. Overrides come
as ``key=value`` strings, parsed the way Hydra reads them on a command line: ``true``/``False`` are
booleans, ``1e-6`` a float, ``["console","tensorboard"]`` a list, ``'error'`` a quoted string, ``null``
None. An unknown key is an error that names the closest valid keys; a value we do not support yet
(a rollout engine that does not exist here, say) is an error that says so.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """An override names an unknown key or gives a value of the wrong type or range."""


class UnsupportedConfigError(ConfigError):
    """An override is valid VERL but asks for something this trainer does not implement yet."""


# ----------------------------------------------------------------------------- sections
@dataclass
class DataConfig:
    train_files: list[str] = field(default_factory=list)  # empty: the synthetic math set
    val_files: list[str] = field(default_factory=list)
    prompt_key: str = "prompt"
    train_batch_size: int = 8  # prompts per step, global
    max_prompt_length: int = 128
    max_response_length: int = 32
    filter_overlong_prompts: bool = False
    truncation: str = "error"
    shuffle: bool = True
    seed: int = 1
    synthetic_size: int = 512  # rows of the generated data set when train_files is empty
    synthetic_difficulty: str = "standard"  # tiny | easy | standard | hard


@dataclass
class ModelConfig:
    path: str = "tiny"  # a preset name or a local Hugging Face model directory
    use_remove_padding: bool = False
    enable_gradient_checkpointing: bool = False
    trust_remote_code: bool = False


@dataclass
class OptimConfig:
    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    lr_warmup_steps: int = 0


@dataclass
class FSDPConfig:
    param_offload: bool = False
    optimizer_offload: bool = False
    model_dtype: str = "auto"  # auto: fp32 on CPU, bf16 on GPU


@dataclass
class ActorConfig:
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    ppo_mini_batch_size: int = 8  # prompts per optimizer step, global (times rollout.n responses)
    ppo_micro_batch_size_per_gpu: int = 4
    ppo_epochs: int = 1
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int = 16384
    # VERL's key; here: fsdp2 (FSDP2 over all workers, one included), dp (a full replica per worker and
    # one flat all-reduce of gradients per mini-batch) or auto (fsdp2 on GPU, dp on CPU). The
    # reference model follows the actor's strategy.
    strategy: str = "auto"
    ulysses_sequence_parallel_size: int = 1
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None  # None: clip_ratio
    clip_ratio_high: float | None = None
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    grad_clip: float = 1.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    entropy_coeff: float = 0.0
    shuffle: bool = False


@dataclass
class RefConfig:
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    log_prob_micro_batch_size_per_gpu: int = 8
    log_prob_use_dynamic_bsz: bool = False
    log_prob_max_token_len_per_gpu: int = 16384


@dataclass
class RolloutConfig:
    name: str = "hf"
    n: int = 4
    temperature: float = 1.0
    top_k: int = -1  # -1 or 0: off
    top_p: float = 1.0
    do_sample: bool = True
    tensor_model_parallel_size: int = 1
    gpu_memory_utilization: float = 0.5
    log_prob_micro_batch_size_per_gpu: int = 8
    log_prob_use_dynamic_bsz: bool = False
    log_prob_max_token_len_per_gpu: int = 16384
    micro_batch_size: int = 0  # sequences per generate call; 0: the whole batch at once
    # Our extension (as vLLM's SamplingParams.ignore_eos): keep sampling after an EOS, so every
    # response is exactly max_response_length tokens (a benchmark's fixed work with random weights).
    ignore_eos: bool = False
    # VERL's vLLM key: True runs the decode step eagerly; False lets the "fast" engine replay CUDA
    # graphs of its decode step on GPU (other engines and CPU runs are always eager).
    enforce_eager: bool = False
    # VERL's key: release the engine's KV cache (and its captured graphs) after each generate call.
    free_cache_engine: bool = False


@dataclass
class ActorRolloutRefConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)


@dataclass
class KLControlConfig:
    type: str = "fixed"
    kl_coef: float = 0.001
    target_kl: float = 0.1
    horizon: int = 10000


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "grpo"
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)


@dataclass
class TrainerSection:
    project_name: str = "rlbench"
    experiment_name: str = "grpo"
    logger: list[str] = field(default_factory=lambda: ["console"])
    nnodes: int = 1
    n_gpus_per_node: int = 1  # on CPU: worker processes per node
    device: str = "cpu"
    total_epochs: int = 1
    total_training_steps: int | None = None
    critic_warmup: int = 0
    val_before_train: bool = False
    test_freq: int = -1
    save_freq: int = -1
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    resume_mode: str = "disable"  # disable | auto | resume_path
    resume_from_path: str | None = None
    seed: int = 1
    log_dir: str = "runs"  # tensorboard event files go under log_dir/project/experiment


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerSection = field(default_factory=TrainerSection)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def flat(self) -> dict[str, Any]:
        """Every leaf as ``{dotted.key: value}``."""
        return {k: get_value(self, k) for k in known_keys()}

    @property
    def world_size(self) -> int:
        return self.trainer.nnodes * self.trainer.n_gpus_per_node


# ----------------------------------------------------------------------------- what we support
# Values that VERL accepts and this trainer does not implement (yet): an explicit error, not a guess.
SUPPORTED_CHOICES: dict[str, tuple[str, ...]] = {
    "data.truncation": ("error", "left", "right", "middle"),
    "data.synthetic_difficulty": ("tiny", "easy", "standard", "hard"),
    "actor_rollout_ref.rollout.name": ("hf", "static", "fast"),
    "actor_rollout_ref.actor.strategy": ("auto", "fsdp2", "dp"),
    "algorithm.adv_estimator": ("grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"),
    "actor_rollout_ref.actor.loss_agg_mode": (
        "token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-mean",
        "seq-mean-token-sum-norm",
    ),
    "actor_rollout_ref.actor.kl_loss_type": ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full"),
    "algorithm.kl_penalty": ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full"),
    "algorithm.kl_ctrl.type": ("fixed", "adaptive"),
    "trainer.device": ("cpu", "cuda"),
    "trainer.resume_mode": ("disable", "auto", "resume_path"),
    "actor_rollout_ref.actor.fsdp_config.model_dtype": ("auto", "fp32", "bf16", "fp16"),
    "actor_rollout_ref.ref.fsdp_config.model_dtype": ("auto", "fp32", "bf16", "fp16"),
}
KNOWN_BUT_UNSUPPORTED: dict[str, dict[str, str]] = {
    "actor_rollout_ref.rollout.name": {
        "sglang": "the SGLang engine is not bundled",
        "vllm": "the vLLM engine is not bundled",
    },
    "actor_rollout_ref.actor.strategy": {
        "fsdp": "FSDP1 is not used here; fsdp2 is",
        "megatron": "the Megatron back end is not bundled",
    },
    "algorithm.adv_estimator": {"gae": "GAE needs a critic worker, which this trainer does not have yet"},
}
LOGGERS: tuple[str, ...] = ("console", "tensorboard")
# Keys accepted for compatibility that change nothing here; documented so nobody is surprised.
ACCEPTED_NO_EFFECT: dict[str, str] = {
    "actor_rollout_ref.model.use_remove_padding": "sequences are packed by attention mask; no effect",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "rollout runs data-parallel, one engine per worker",
    "actor_rollout_ref.rollout.gpu_memory_utilization": "the rollout KV cache is sized from the batch",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "sequence parallelism is not implemented; must be 1 on one worker",
    "trainer.critic_warmup": "no critic",
    "trainer.val_before_train": "validation is not run",
    "trainer.test_freq": "validation is not run",
    "data.val_files": "validation is not run",
}


# ----------------------------------------------------------------------------- key walking
def _leaf_fields(cls: type, prefix: str = "") -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out.update(_leaf_fields(tp, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = tp
    return out


_KEY_TYPES: dict[str, Any] = _leaf_fields(Config)


def known_keys() -> list[str]:
    """Every dotted key the trainer accepts, in declaration order."""
    return list(_KEY_TYPES)


def get_value(cfg: Config, key: str) -> Any:
    obj: Any = cfg
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def _set_value(cfg: Config, key: str, value: Any) -> None:
    *parents, last = key.split(".")
    obj: Any = cfg
    for part in parents:
        obj = getattr(obj, part)
    setattr(obj, last, value)


def closest_keys(key: str, n: int = 3) -> list[str]:
    keys = known_keys()
    close = difflib.get_close_matches(key, keys, n=n, cutoff=0.6)
    if not close:  # fall back to matching on the last component, e.g. "rollout.nn" -> rollout.n
        tail = key.rsplit(".", 1)[-1]
        close = [k for k in keys if k.rsplit(".", 1)[-1] == tail][:n]
    return close


# ----------------------------------------------------------------------------- value parsing
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


def apply_override(cfg: Config, text: str) -> None:
    key, raw = split_override(text)
    if key not in _KEY_TYPES:
        close = closest_keys(key)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"unknown config key {key!r}{hint}")
    _set_value(cfg, key, _coerce(key, parse_literal(raw), _KEY_TYPES[key]))


# ----------------------------------------------------------------------------- validation
def _positive(cfg: Config, *keys: str) -> None:
    for key in keys:
        if get_value(cfg, key) < 1:
            raise ConfigError(f"{key} must be at least 1, got {get_value(cfg, key)}")


def validate(cfg: Config) -> Config:
    """Cross-field checks VERL makes at start-up, with messages that say what would be valid."""
    for key, choices in SUPPORTED_CHOICES.items():
        value = get_value(cfg, key)
        if value in KNOWN_BUT_UNSUPPORTED.get(key, {}):
            why = KNOWN_BUT_UNSUPPORTED[key][value]
            raise UnsupportedConfigError(
                f"{key}={value} is not supported yet: {why}; supported: {', '.join(choices)}"
            )
        if value not in choices:
            raise ConfigError(f"{key}={value!r} is not valid; choose one of: {', '.join(choices)}")
    for name in cfg.trainer.logger:
        if name not in LOGGERS:
            raise UnsupportedConfigError(
                f"trainer.logger {name!r} is not supported; available: {', '.join(LOGGERS)}"
            )
    _positive(
        cfg,
        "data.train_batch_size",
        "data.max_prompt_length",
        "data.max_response_length",
        "actor_rollout_ref.rollout.n",
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "actor_rollout_ref.actor.ppo_epochs",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
        "trainer.nnodes",
        "trainer.n_gpus_per_node",
        "trainer.total_epochs",
    )
    actor = cfg.actor_rollout_ref.actor
    if actor.ppo_mini_batch_size > cfg.data.train_batch_size:
        raise ConfigError(
            f"actor_rollout_ref.actor.ppo_mini_batch_size ({actor.ppo_mini_batch_size}) must not exceed "
            f"data.train_batch_size ({cfg.data.train_batch_size})"
        )
    if cfg.data.train_batch_size % actor.ppo_mini_batch_size:
        raise ConfigError(
            f"data.train_batch_size ({cfg.data.train_batch_size}) must be a multiple of "
            f"actor_rollout_ref.actor.ppo_mini_batch_size ({actor.ppo_mini_batch_size})"
        )
    responses_per_mini = actor.ppo_mini_batch_size * cfg.actor_rollout_ref.rollout.n
    if responses_per_mini % cfg.world_size:
        raise ConfigError(
            f"ppo_mini_batch_size x rollout.n = {responses_per_mini} responses must split evenly over "
            f"{cfg.world_size} workers (trainer.nnodes x trainer.n_gpus_per_node)"
        )
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.temperature <= 0:
        raise ConfigError(f"actor_rollout_ref.rollout.temperature must be > 0, got {rollout.temperature}")
    if not 0.0 < rollout.top_p <= 1.0:
        raise ConfigError(f"actor_rollout_ref.rollout.top_p must be in (0, 1], got {rollout.top_p}")
    if not 0.0 <= actor.clip_ratio < 1.0:
        raise ConfigError(f"actor_rollout_ref.actor.clip_ratio must be in [0, 1), got {actor.clip_ratio}")
    if actor.ulysses_sequence_parallel_size != 1:
        raise UnsupportedConfigError(
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size="
            f"{actor.ulysses_sequence_parallel_size} is not supported yet: sequence parallelism is not "
            "implemented; use 1"
        )
    if cfg.trainer.resume_mode == "resume_path" and not cfg.trainer.resume_from_path:
        raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path")
    return cfg


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
            _set_value(cfg, key, out)
    return cfg


def build_config(overrides: typing.Iterable[str] = (), base: Config | None = None) -> Config:
    """Defaults, then each ``key=value`` override in order, then validation."""
    cfg = copy.deepcopy(base) if base is not None else Config()
    for text in overrides:
        apply_override(cfg, text)
    return validate(resolve_interpolations(cfg))


def clip_ratios(actor: ActorConfig) -> tuple[float, float]:
    """(eps_low, eps_high): each falls back to clip_ratio, as in VERL."""
    low = actor.clip_ratio if actor.clip_ratio_low is None else actor.clip_ratio_low
    high = actor.clip_ratio if actor.clip_ratio_high is None else actor.clip_ratio_high
    return low, high
