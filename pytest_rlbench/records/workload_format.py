"""The workload section of a run record: what is needed to do the same work again, each value with
where it comes from.

Every value is a ``Sourced``: ``published`` (the source states it, or the run measured/configured it),
``inferred`` (derived from published figures, e.g. 512 sequences per step from the throughputs that
``pytest_rlbench.verdict.consistency`` recomputes) or ``assumed`` (a stated default; ``why`` says which and
why). A comparison that rests on the workload lists its assumed values beside its verdict.

The model's numbers are the record's ``$.model`` section (one definition); ``architecture`` says where
they come from and names the model. Token budgets are per GPU, as VERL's keys are; ``parallelism``
says how the source split the work (dp, tp, sp) and is not part of the work itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any

from pytest_rlbench.records.length_shapes import LOGNORMAL, NATURAL, SHAPES

PUBLISHED = "published"
INFERRED = "inferred"
ASSUMED = "assumed"
ORIGINS: tuple[str, ...] = (PUBLISHED, INFERRED, ASSUMED)

_OMIT = {"omit_default": True}


@dataclass
class Sourced:
    """One workload value and where it comes from (one of ORIGINS); ``why`` explains an inference or an
    assumption."""

    value: Any
    source: str
    why: str | None = field(default=None, metadata=_OMIT)


@dataclass
class LengthDistribution:
    """Sequence lengths in tokens: mean, max (the cap), a named shape (length_shapes.SHAPES) and, for a
    lognormal, its sigma. A "natural" shape's mean is what was measured, or null."""

    mean: Sourced
    max: Sourced
    shape: Sourced
    sigma: Sourced | None = field(default=None, metadata=_OMIT)


@dataclass
class Workload:
    """The work of one step, as a replay needs it."""

    architecture: Sourced  # the model's name; its numbers are the record's $.model
    dtype: Sourced
    sequences_per_step: Sourced  # responses, all GPUs together
    sequences_per_gpu: Sourced
    samples_per_prompt: Sourced  # rollout.n
    prompt_length: LengthDistribution
    response_length: LengthDistribution
    use_kl_loss: Sourced  # True: a reference model's log-probs are computed every step
    kl_loss_type: Sourced
    ppo_epochs: Sourced
    ppo_mini_batches: Sourced  # optimizer steps per PPO epoch (train_batch_size / ppo_mini_batch_size)
    use_dynamic_bsz: Sourced
    ppo_max_token_len_per_gpu: Sourced
    log_prob_max_token_len_per_gpu: Sourced
    gradient_checkpointing: Sourced
    param_offload: Sourced
    optimizer_offload: Sourced
    temperature: Sourced
    # {"dp": .., "rollout_tp": .., "sp": ..}: how the work was split. A run's dp counts its workers; a
    # published record's may count GPUs over sp (VERL's) or over tp (RLinf's); older runs name "tp".
    parallelism: Sourced
    # The GPU model, only where the record's hardware section cannot state it (an assumed one): what a
    # per-GPU gate reads the baseline's GPUs as, listed (once, with that reading) beside its verdicts.
    gpu_model: Sourced | None = field(default=None, metadata=_OMIT)
    # What one save writes per model parameter, all files together, where a record gives a
    # save_checkpoint time without the bytes it wrote (a published run; a run of ours records them):
    # the work behind save_checkpoint's GB/s per GPU.
    checkpoint_bytes_per_parameter: Sourced | None = field(default=None, metadata=_OMIT)


# Where parameters and optimizer state live between phases: how a framework fits the work in memory
# (as its parallelism is how it splits it), not work: the math per GPU is the same. A run that places
# them otherwise is still gated against the baseline; the verdict names the difference.
MEMORY_PLACEMENT: tuple[str, ...] = ("param_offload", "optimizer_offload")

_NUMBER = (int, float)
# What each value must be (bool is checked apart from int: JSON's true is not a count).
VALUE_TYPES: dict[str, tuple[type, ...]] = {
    "architecture": (str,),
    "dtype": (str,),
    "sequences_per_step": (int,),
    "sequences_per_gpu": _NUMBER,
    "samples_per_prompt": (int,),
    "use_kl_loss": (bool,),
    "kl_loss_type": (str,),
    "ppo_epochs": (int,),
    "ppo_mini_batches": (int,),
    "use_dynamic_bsz": (bool,),
    "ppo_max_token_len_per_gpu": (int,),
    "log_prob_max_token_len_per_gpu": (int,),
    "gradient_checkpointing": (bool,),
    "param_offload": (bool,),
    "optimizer_offload": (bool,),
    "temperature": _NUMBER,
    "parallelism": (dict,),
    "gpu_model": (str,),
    "checkpoint_bytes_per_parameter": _NUMBER,
    "mean": _NUMBER,
    "max": (int,),
    "shape": (str,),
    "sigma": _NUMBER,
}


def sourced_items(workload: Workload) -> Iterator[tuple[str, Sourced]]:
    """(dotted name, value) of every value, in declaration order ("response_length.mean")."""
    for f in fields(workload):
        item = getattr(workload, f.name)
        if item is None:  # an optional value not given
            continue
        if isinstance(item, LengthDistribution):
            for g in fields(item):
                inner = getattr(item, g.name)
                if inner is not None:
                    yield f"{f.name}.{g.name}", inner
        else:
            yield f.name, item


# Assumed values a gate reads as the baseline's hardware: listed by pytest_rlbench.verdict.gate_basis
# (hardware_assumptions) on one line with how the gate reads them (an H100 taken as H100 SXM), not here.
HARDWARE_READINGS = ("gpu_model",)


def assumptions(workload: Workload | None) -> list[str]:
    """Each assumed value as one line: "response_length.shape = 'lognormal' (why)"; the hardware's
    (``HARDWARE_READINGS``) left to the gate that reads them."""
    if workload is None:
        return []
    return [
        f"{name} = {item.value!r}" + (f" ({item.why})" if item.why else "")
        for name, item in sourced_items(workload)
        if item.source == ASSUMED and name not in HARDWARE_READINGS
    ]


def _type_problem(name: str, value: Any) -> str | None:
    expected = VALUE_TYPES[name.rsplit(".", 1)[-1]]
    if isinstance(value, bool) != (bool in expected) or not isinstance(value, expected):
        return f"expected {' or '.join(t.__name__ for t in expected)}, found {value!r}"
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and value <= 0
        and name != "temperature"
    ):
        return f"expected a number > 0, found {value!r}"
    return None


def check_workload(workload: Workload, world_size: int, path: str, problems: list[str]) -> None:
    """Origins, value types and the rules between values (sequences per step and per GPU, shapes)."""
    for name, item in sourced_items(workload):
        if item.source not in ORIGINS:
            problems.append(
                f"{path}.{name}.source: expected one of {', '.join(ORIGINS)}, found {item.source!r}"
            )
        if item.source != PUBLISHED and not item.why:
            problems.append(f"{path}.{name}.why: an {item.source} value needs a reason")
        natural_mean = name.endswith(".mean") and item.value is None
        problem = None if natural_mean else _type_problem(name, item.value)
        if problem:
            problems.append(f"{path}.{name}.value: {problem}")
    for part in ("prompt_length", "response_length"):
        dist: LengthDistribution = getattr(workload, part)
        shape = dist.shape.value
        if shape not in SHAPES:
            problems.append(
                f"{path}.{part}.shape.value: expected one of {', '.join(SHAPES)}, found {shape!r}"
            )
        if (shape == LOGNORMAL) != (dist.sigma is not None):
            problems.append(f"{path}.{part}.sigma: a lognormal shape needs sigma, and only it has one")
        if dist.mean.value is None and shape != NATURAL:
            problems.append(f"{path}.{part}.mean.value: only a natural shape may leave its mean unknown")
    per_gpu, per_step = workload.sequences_per_gpu.value, workload.sequences_per_step.value
    if (
        isinstance(per_gpu, int | float)
        and isinstance(per_step, int)
        and abs(per_gpu * world_size - per_step) > 1e-6
    ):
        problems.append(
            f"{path}.sequences_per_gpu.value: expected sequences_per_step / world_size = "
            f"{per_step / world_size:g}, found {per_gpu!r}"
        )
