"""The trainer's configuration sections, in VERL's dotted names and meanings, and key walking.

The keys and defaults follow VERL's ``verl/trainer/config/ppo_trainer.yaml`` (v0.5): every key of a
VERL GRPO command line (``python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo ...``) is
here with VERL's meaning; a few extensions are marked as ours.
"""

from __future__ import annotations

import dataclasses
import difflib
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
    # Our extension: > 0 pads each synthetic prompt to exactly this many chat-templated tokens (a
    # baseline's prompt length); 0 keeps the natural lengths. Only when train_files is empty.
    synthetic_prompt_length: int = 0


@dataclass
class ModelConfig:
    path: str = "tiny"  # a preset name or a local Hugging Face model directory
    # VERL's key: the actor's and ref's forward run each micro-batch's rows end to end with no padding
    # (trainer/models/packed_attention.py); off, the rows are left-justified and padded to the longest
    use_remove_padding: bool = False
    enable_gradient_checkpointing: bool = False
    # Our extension: what the checkpointed layers' recompute may skip (trainer/models/checkpointing.py):
    # full (recompute everything, VERL's), save_attention, save_matmuls or mlp (recompute each
    # layer's MLP block only). Needs enable_gradient_checkpointing=True unless full.
    gradient_checkpointing_policy: str = "full"
    # Our extension: checkpoint only the first this many decoder layers (None: all, VERL's); the rest
    # keep their activations, trading memory for the recompute. Needs enable_gradient_checkpointing.
    gradient_checkpointing_layers: int | None = None
    trust_remote_code: bool = False
    # VERL's key: liger-kernel's fused RMSNorm, SwiGLU and RoPE in the actor's and ref's forward and
    # backward (trainer/models/liger.py); CUDA only
    use_liger: bool = False


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
class PolicyLossConfig:
    # VERL's actor_rollout_ref.actor.policy_loss.loss_mode: a name of
    # trainer.algorithms.policy_loss.POLICY_LOSSES (VERL's "vanilla" is the PPO clipped objective).
    loss_mode: str = "vanilla"


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
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)


@dataclass
class RefConfig:
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    log_prob_micro_batch_size_per_gpu: int = 8
    log_prob_use_dynamic_bsz: bool = False
    log_prob_max_token_len_per_gpu: int = 16384


@dataclass
class TargetLengthsConfig:
    """Our extension: each row's response length drawn per row (trainer/rollout/target_lengths.py),
    so random weights generate a baseline's ragged lengths. Every engine stops a row exactly at its
    target; an EOS before it does not end the row (as with ignore_eos)."""

    distribution: str = "none"  # none (rows end at EOS or the limit) | a name of DISTRIBUTIONS
    mean: float = 0.0  # tokens; 0 < mean <= data.max_response_length unless distribution is none
    sigma: float = 0.6  # log-space standard deviation (lognormal only)
    # 0: worker w generates the rows of the step's w-th share of prompts. M (> the world size): the
    # step is drawn as M GPUs' shares and the workers generate the slowest ones to decode
    # (trainer/rollout/replay_shares.py): a replay of an M-GPU run waits for that run's slowest GPU.
    slowest_of: int = 0
    # With slowest_of (ignored without): GPUs that decoded one share together in the run replayed (its rollout's
    # tensor-parallel size); consecutive workers split each share they generate this many ways.
    gpus_per_share: int = 1


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
    target_lengths: TargetLengthsConfig = field(default_factory=TargetLengthsConfig)


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
    max_actor_ckpt_to_keep: int | None = None  # VERL's key: None keeps every checkpoint
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    resume_mode: str = "disable"  # disable | auto | resume_path
    resume_from_path: str | None = None
    seed: int = 1
    # VERL's key: deal each mini-batch's rows out to the workers by length, so that no worker holds
    # more tokens than it must (trainer/driver/sharding.py: balanced_mini_batch_shards)
    balance_batch: bool = True
    log_dir: str = "runs"  # tensorboard event files go under log_dir/project/experiment
    phase_timeout_s: float = 1800.0  # longest wait for the workers in one phase (a hung worker fails the run)


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


KEY_TYPES: dict[str, Any] = _leaf_fields(Config)  # dotted key -> annotated type


def known_keys() -> list[str]:
    """Every dotted key the trainer accepts, in declaration order."""
    return list(KEY_TYPES)


def get_value(cfg: Config, key: str) -> Any:
    obj: Any = cfg
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def set_value(cfg: Config, key: str, value: Any) -> None:
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


def clip_ratios(actor: ActorConfig) -> tuple[float, float]:
    """(eps_low, eps_high): each falls back to clip_ratio, as in VERL."""
    low = actor.clip_ratio if actor.clip_ratio_low is None else actor.clip_ratio_low
    high = actor.clip_ratio if actor.clip_ratio_high is None else actor.clip_ratio_high
    return low, high
