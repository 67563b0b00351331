"""Replaying a baseline's workload per GPU: the trainer config keys that make a run on the GPUs at hand
do the baseline's work per GPU (``workload_overrides``).

A replay on W GPUs runs sequences_per_gpu x W sequences a step (train_batch_size prompts of
rollout.n samples), in the baseline's number of PPO mini-batches, with its length distributions,
algorithm settings, dtype and, when a model preset has its architecture, that preset. Each setting
says which workload values it comes from, and where those come from (published, inferred, assumed).
``pytest_rlbench.records.workload`` re-exports these names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_rlbench.records.length_shapes import CONSTANT, LOGNORMAL, NATURAL
from pytest_rlbench.records.record import RunRecord
from pytest_rlbench.records.workload_format import MEMORY_PLACEMENT, Sourced, Workload
from trainer.models.flops import DecoderArch

# The config keys of the per-row target lengths (trainer.rollout); "none": the model's own lengths.
TARGET_LENGTHS = "actor_rollout_ref.rollout.target_lengths"
NO_TARGET = "none"
# The run record's config.settings key of rollout.target_lengths.slowest_of (trainer/rollout/replay_shares.py).
SLOWEST_OF = "slowest_of"
GPUS_PER_SHARE = "gpus_per_share"  # and of rollout.target_lengths.gpus_per_share, recorded where above 1
MODEL_DTYPES: dict[str, str] = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


class WorkloadError(ValueError):
    """A workload that cannot be replayed on the GPUs at hand; the message says what does not divide."""


@dataclass(frozen=True)
class WorkloadSetting:
    """One trainer config key a replay sets, its value and why (from which workload values)."""

    key: str
    value: Any
    why: str

    @property
    def places_memory(self) -> bool:
        """Whether it says where parameters or optimizer state wait (``MEMORY_PLACEMENT``): how a
        framework fits the work, not the work, so a replay that sets it otherwise still gates."""
        return self.key.rsplit(".", 1)[-1] in MEMORY_PLACEMENT


def _origin(name: str, item: Sourced) -> str:
    return f"{name} {item.value!r} ({item.source})"


def _divide(total: int | float, by: int, what: str) -> int:
    if total != int(total) or int(total) % by:
        raise WorkloadError(f"cannot replay per GPU: {what} = {total:g} is not a multiple of {by}")
    return int(total) // by


def matching_preset(model: DecoderArch) -> str | None:
    """The name of the model preset (trainer.models.presets) with this architecture, if one has it."""
    from trainer.models.presets import ARCH_FIELDS, PRESET_ARCHITECTURES  # torch: only when asked

    names = {
        "num_hidden_layers": "num_layers",
        "num_attention_heads": "num_heads",
        "num_key_value_heads": "num_kv_heads",
    }
    wanted = model.to_dict()
    for preset, row in PRESET_ARCHITECTURES.items():
        numbers = {names.get(k, k): v for k, v in zip(ARCH_FIELDS, row, strict=True)}
        if all(numbers[k] == v for k, v in wanted.items()):
            return preset
    return None


def _length_settings(w: Workload) -> list[WorkloadSetting]:
    prompt, response = w.prompt_length, w.response_length
    out = [
        WorkloadSetting("data.max_prompt_length", prompt.max.value, _origin("prompt_length.max", prompt.max)),
        WorkloadSetting(
            "data.max_response_length", response.max.value, _origin("response_length.max", response.max)
        ),
    ]
    if prompt.shape.value == CONSTANT:
        why = f"{_origin('prompt_length.mean', prompt.mean)}, every prompt alike"
        out.append(WorkloadSetting("data.synthetic_prompt_length", round(prompt.mean.value), why))
    shape = response.shape.value
    # Every row at the cap is what ignore_eos does (a run saved with it replays with it).
    at_cap = shape == CONSTANT and response.mean.value == response.max.value
    target = NO_TARGET if shape == NATURAL or at_cap else shape
    out.append(
        WorkloadSetting(
            f"{TARGET_LENGTHS}.distribution", target, _origin("response_length.shape", response.shape)
        )
    )
    if at_cap:
        why = f"{_origin('response_length.shape', response.shape)} at the cap"
        out.append(WorkloadSetting("actor_rollout_ref.rollout.ignore_eos", True, why))
    elif shape != NATURAL:
        mean = response.mean
        out.append(
            WorkloadSetting(
                f"{TARGET_LENGTHS}.mean", float(mean.value), _origin("response_length.mean", mean)
            )
        )
    if response.sigma is not None:
        sigma = response.sigma
        out.append(
            WorkloadSetting(
                f"{TARGET_LENGTHS}.sigma", float(sigma.value), _origin("response_length.sigma", sigma)
            )
        )
    return out


def _algorithm_settings(w: Workload, prompts: int) -> list[WorkloadSetting]:
    arr = "actor_rollout_ref"
    mini = w.ppo_mini_batches
    mini_size = _divide(prompts, mini.value, f"{prompts} prompts per step / ppo_mini_batches {mini.value}")
    out = [
        WorkloadSetting(
            f"{arr}.actor.ppo_mini_batch_size",
            mini_size,
            f"{prompts} prompts / {_origin('ppo_mini_batches', mini)}",
        ),
        WorkloadSetting(f"{arr}.actor.ppo_epochs", w.ppo_epochs.value, _origin("ppo_epochs", w.ppo_epochs)),
        WorkloadSetting(
            f"{arr}.actor.use_kl_loss", w.use_kl_loss.value, _origin("use_kl_loss", w.use_kl_loss)
        ),
    ]
    if w.use_kl_loss.value:
        out.append(
            WorkloadSetting(
                f"{arr}.actor.kl_loss_type", w.kl_loss_type.value, _origin("kl_loss_type", w.kl_loss_type)
            )
        )
    dynamic = _origin("use_dynamic_bsz", w.use_dynamic_bsz)
    for key in (
        f"{arr}.actor.use_dynamic_bsz",
        f"{arr}.ref.log_prob_use_dynamic_bsz",
        f"{arr}.rollout.log_prob_use_dynamic_bsz",
    ):
        out.append(WorkloadSetting(key, w.use_dynamic_bsz.value, dynamic))
    if w.use_dynamic_bsz.value:
        train, log_prob = w.ppo_max_token_len_per_gpu, w.log_prob_max_token_len_per_gpu
        out.append(
            WorkloadSetting(
                f"{arr}.actor.ppo_max_token_len_per_gpu",
                train.value,
                _origin("ppo_max_token_len_per_gpu", train),
            )
        )
        for section in ("ref", "rollout"):
            why = _origin("log_prob_max_token_len_per_gpu", log_prob)
            out.append(
                WorkloadSetting(f"{arr}.{section}.log_prob_max_token_len_per_gpu", log_prob.value, why)
            )
    checkpointing = w.gradient_checkpointing
    out.append(
        WorkloadSetting(
            f"{arr}.model.enable_gradient_checkpointing",
            checkpointing.value,
            _origin("gradient_checkpointing", checkpointing),
        )
    )
    for key, item in (
        ("actor.fsdp_config.param_offload", w.param_offload),
        ("ref.fsdp_config.param_offload", w.param_offload),
        ("actor.fsdp_config.optimizer_offload", w.optimizer_offload),
    ):
        out.append(WorkloadSetting(f"{arr}.{key}", item.value, _origin(key.rsplit(".", 1)[-1], item)))
    out.append(
        WorkloadSetting(
            f"{arr}.rollout.temperature", float(w.temperature.value), _origin("temperature", w.temperature)
        )
    )
    return out


def decode_replicas(record: RunRecord) -> tuple[int, str | None]:
    """Rollout replicas of the record (its devices over the rollout's tensor-parallel size), and the
    assumption made when the workload's parallelism names no rollout_tp (then tp, else 1, is taken)."""
    layout = record.workload.parallelism.value if record.workload else {}
    tp = layout.get("rollout_tp", layout.get("tp", 1)) or 1
    replicas = max(1, record.hardware.world_size // tp)
    if "rollout_tp" in layout:
        return replicas, None
    return (
        replicas,
        f"parallelism: the rollout's tensor-parallel size taken as {tp} ({replicas} decode replicas)",
    )


def rollout_tp(record: RunRecord) -> int:
    """The GPUs that decoded one share together: the record's GPUs over its decode replicas."""
    return record.hardware.world_size // decode_replicas(record)[0]


def run_shares(run: RunRecord) -> tuple[int, int]:
    """(slowest_of, gpus_per_share) as the run's config set them (records: config.settings)."""
    return run.config.settings.get(SLOWEST_OF, 0), run.config.settings.get(GPUS_PER_SHARE, 1)


def expected_shares(baseline: RunRecord, world_size: int) -> tuple[int, int]:
    """(rollout.target_lengths.slowest_of, gpus_per_share) as a replay of ``baseline`` on ``world_size``
    GPUs sets them (trainer/rollout/replay_shares.py); (0, 1): each GPU generates its own share.

    A saved replay that generated the slowest of K shares: the same again (a GPU count its shares do not
    split over is then refused at start-up), or every share on as many shares' GPUs or more. A published run on more GPUs than the replay, with drawn lengths that differ by share
    (log-normal): the slowest of its decode replicas' shares (one per GPU, or per tensor-parallel group
    of t GPUs, each split over t of the replay's), where the replay's GPUs make whole groups."""
    own, per = run_shares(baseline)
    if own:  # on as many shares or more: every share; on a count that splits none: refused at start-up
        return (0, 1) if world_size % per == 0 and own <= world_size // per else (own, per)
    w, tp = baseline.workload, rollout_tp(baseline)
    if w is None or w.response_length.shape.value != LOGNORMAL or world_size >= baseline.hardware.world_size:
        return 0, 1
    if world_size % tp:
        return 0, 1  # a share of t GPUs does not split over these: not modelled
    return decode_replicas(baseline)[0], tp


def _share_settings(baseline: RunRecord, world_size: int) -> list[WorkloadSetting]:
    shares, per = expected_shares(baseline, world_size)
    if not shares:
        return []
    if baseline.config.settings.get(SLOWEST_OF):
        why = f"the baseline generated the slowest of {shares} shares of each step's drawn lengths, {per} GPU(s) each"
    else:
        group = "GPUs" if per == 1 else f"decode replicas (of {per} GPUs: tensor-parallel rollout)"
        why = (
            f"the baseline's {shares} {group} each generated a share of the step's drawn lengths and its "
            f"generation lasted as long as the slowest; this run's {world_size} GPU(s) generate the "
            f"{world_size // per} slowest of those {shares}"
        )
    out = [WorkloadSetting(f"{TARGET_LENGTHS}.slowest_of", shares, why)]
    if per > 1:
        out.append(WorkloadSetting(f"{TARGET_LENGTHS}.gpus_per_share", per, f"each share split over {per} GPUs, as decoded"))
    return out


def workload_overrides(baseline: RunRecord, world_size: int) -> list[WorkloadSetting]:
    """The trainer settings that make a run on ``world_size`` GPUs do ``baseline``'s work per GPU.

    WorkloadError when the baseline has no workload, or when its sequences per GPU x ``world_size``
    are not whole prompts (rollout.n each) or do not split into its number of PPO mini-batches.
    """
    w = baseline.workload
    if w is None:
        raise WorkloadError(f"baseline {baseline.name!r} records no workload: it cannot be replayed")
    per_gpu, n = w.sequences_per_gpu, w.samples_per_prompt
    sequences = per_gpu.value * world_size
    prompts = _divide(sequences, n.value, f"{_origin('sequences_per_gpu', per_gpu)} x {world_size} GPU(s)")
    model = baseline.model
    preset = matching_preset(model)
    preset_why = (
        f"the preset with {_origin('architecture', w.architecture)}'s numbers"
        if preset
        else f"no preset has {model.name}'s architecture: give --rl-model"
    )
    out = [
        WorkloadSetting(
            "data.train_batch_size",
            prompts,
            f"{_origin('sequences_per_gpu', per_gpu)} x {world_size} GPU(s) / rollout.n",
        ),
        WorkloadSetting("actor_rollout_ref.rollout.n", n.value, _origin("samples_per_prompt", n)),
        *_length_settings(w),
        *_algorithm_settings(w, prompts),
        WorkloadSetting(
            "actor_rollout_ref.actor.fsdp_config.model_dtype",
            MODEL_DTYPES[model.dtype],
            _origin("dtype", w.dtype),
        ),
    ]
    out += _share_settings(baseline, world_size)
    if preset is not None:
        out.append(WorkloadSetting("actor_rollout_ref.model.path", preset, preset_why))
    return out
