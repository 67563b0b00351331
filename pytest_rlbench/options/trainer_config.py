"""The one path from the options to the trainer config: every setting becomes an override.

A dedicated option is sugar for one override (``--rl-nodes 2`` is ``trainer.nnodes=2``, see
``OPTION_KEYS``). The session's trainer config is built once, by ``trainer.config.build_config``, from

    the session's defaults  (synthetic data file, checkpoint dir in the session's temp dir, GPU count;
                             with vLLM on CPU a model and memory fraction it can run: VLLM_CPU_DEFAULTS)
    the ini file's rl_config (the suites' default work)
    a replayed workload     (--rl-workload: a baseline's work per GPU, see pytest_rlbench.options.replay)
    the options' overrides  (--rl-nodes, --rl-model, ..., each with where it came from)
    the command line's --rl-config (the later wins per key)

so a user's value wins over a session default with no re-parsing. A key given both by its option and
in --rl-config is one setting given twice and is refused, so a report never shows one value while
the trainer ran with another. A --rl-config override of a key an option owns, given without the
option, counts as the option (its value checked and shown the same way).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_rlbench.options.replay import replay_overrides, replay_settings
from pytest_rlbench.options.values import OptionError
from pytest_rlbench.records.workload import SYNTHETIC_FILE
from trainer.config import (
    ROLLOUT_KEY,
    Config,
    ConfigError,
    Override,
    apply_override,
    build_config,
    get_value,
)

if TYPE_CHECKING:
    from pytest_rlbench.options.parsed import RLBenchOptions

# The trainer key each dedicated option sets (trainer.n_gpus_per_node only with --gpu: on CPU it is
# the number of worker processes per node, the user's to set with --rl-config).
OPTION_KEYS: dict[str, str] = {
    "rl_gpu": "trainer.device",
    "rl_nodes": "trainer.nnodes",
    "rl_gpus_per_node": "trainer.n_gpus_per_node",
    "rl_model": "actor_rollout_ref.model.path",
    "rl_rollout": ROLLOUT_KEY,
    "rl_dataset": "data.train_files",
    "rl_phase_timeout": "trainer.phase_timeout_s",
}
SESSION_DEFAULT = "the session's default"
VLLM_ON_CPU = "the session's default for vLLM on CPU"
# What a session sets when vLLM rolls out on CPU (the trainer's engine or a panel one) and the user
# does not set the key: vLLM's CPU attention refuses the tiny preset's head_dim 16, and there
# gpu_memory_utilization is the fraction of *host* memory each worker's engine reserves (README, "vLLM").
VLLM_CPU_DEFAULTS: dict[str, Any] = {
    "actor_rollout_ref.model.path": "tiny-hd64",
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.1,
}


def user_overrides(texts: Sequence[str], source: str) -> tuple[list[Override], Config]:
    """The --rl-config overrides, each checked against the schema (an error names ``source``), and a
    scratch Config with all of them applied in order (so it holds the value that wins per key)."""
    scratch = Config()
    out = []
    for text in texts:
        try:
            override = Override.parse(text, f"{source} {text}")
            apply_override(scratch, override)
        except ConfigError as exc:
            raise OptionError(f"{source}: {exc}") from None
        out.append(override)
    return out, scratch


def given_in_config(dest: str, user: Sequence[Override]) -> Override | None:
    """The last --rl-config override of the key ``dest`` owns, or None."""
    key = OPTION_KEYS[dest]
    return next((o for o in reversed(user) if o.key == key), None)


def refuse_given_twice(dest: str, shown: str, user: Sequence[Override]) -> None:
    """``shown`` (``--rl-nodes=2``) and a --rl-config override of the same key: a usage error."""
    twice = given_in_config(dest, user)
    if twice is not None:
        raise OptionError(
            f"{shown} and {twice.source} set the same thing, {OPTION_KEYS[dest]}: one key given twice; "
            "give it once, with the option or in --rl-config"
        )


def option_value(dest: str, scratch: Config) -> Any:
    """The value that --rl-config gave the key ``dest`` owns (the later override wins)."""
    return get_value(scratch, OPTION_KEYS[dest])


def option_overrides(values: Mapping[str, Any], sources: Mapping[str, str]) -> list[Override]:
    """The overrides the dedicated options stand for, in OPTION_KEYS order.

    ``values``: each option's checked value (gpu a bool, dataset a Path or None); ``sources``: where
    each was given (the option, the ini file, or the --rl-config override it was folded from). An
    option not given adds nothing: the trainer's default (or the session's) applies."""
    out = []
    for dest, key in OPTION_KEYS.items():
        if dest not in sources or values.get(dest) is None:
            continue
        value = values[dest]
        if dest == "rl_gpu":
            value = "cuda" if value else "cpu"
        elif dest == "rl_dataset":
            value = [str(value)]
        out.append(Override(key, value, sources[dest]))
    return out


def session_defaults(
    opts: RLBenchOptions, workdir: Path | None = None, gpus_per_node: int | None = None
) -> list[Override]:
    """What the session sets unless the user does: on GPU the cluster's GPUs per node (1 stands in
    until it is known); with ``workdir``, the synthetic data file and the checkpoint directory there;
    with vLLM on CPU, ``vllm_cpu_defaults``."""
    out = []
    if opts.gpu and opts.gpus_per_node is None:
        out.append(Override("trainer.n_gpus_per_node", gpus_per_node or 1, SESSION_DEFAULT))
    if workdir is not None:
        if opts.dataset is None:
            out.append(Override("data.train_files", [str(workdir / SYNTHETIC_FILE)], SESSION_DEFAULT))
        # Checkpoints of a benchmark go to the session's temp dir, not the working directory.
        out.append(Override("trainer.default_local_dir", str(workdir / "checkpoints"), SESSION_DEFAULT))
    return [*out, *vllm_cpu_defaults(opts)]


def vllm_cpu_defaults(opts: RLBenchOptions) -> list[Override]:
    """VLLM_CPU_DEFAULTS' keys that the user leaves unset, when vLLM rolls out on CPU (else none)."""
    if opts.gpu or "vllm" not in (opts.rollout, *opts.rollout_panel):
        return []
    given = {o.key for o in (*opts.ini_overrides, *opts.overrides)}  # a replay's, applied later, wins too
    return [Override(key, value, VLLM_ON_CPU) for key, value in VLLM_CPU_DEFAULTS.items() if key not in given]


def build_trainer_config(
    opts: RLBenchOptions,
    gpus_per_node: int | None = None,
    workdir: Path | None = None,
    check_names: bool = True,
    check_sizes: bool = True,
) -> Config:
    """The trainer config, built once: session defaults, the ini file's rl_config, a replayed workload
    (which so replaces the ini file's default work), then the options' and the command line's
    --rl-config overrides.

    gpus_per_node: the cluster's count when the options leave it open (--gpu alone); workdir: the
    session's temp dir (without it, no data file or checkpoint dir is set: the start-up check);
    check_names: also check the names that registries hold (rollout engine, estimator, ...);
    check_sizes: also check the batch sizes' relations (the session checks them with the data set's size).
    """
    first = [*session_defaults(opts, workdir, gpus_per_node), *opts.ini_overrides]
    if opts.workload_record is not None:
        first = [*first, *workload_overrides_for(opts, first)]
    return build_config([*first, *opts.overrides], check_names=check_names, check_sizes=check_sizes)


def workload_overrides_for(opts: RLBenchOptions, defaults: Sequence[Override]) -> list[Override]:
    """--rl-workload's overrides for the number of workers the rest of the config gives."""
    source = opts.source_of("rl_workload")
    baseline = opts.workload_record
    assert baseline is not None  # loaded with the options
    scratch = Config()  # only for the number of workers: the rest is checked once the workload is in
    for override in [*defaults, *opts.overrides]:
        apply_override(scratch, override)
    world_size = scratch.world_size
    settings = replay_settings(baseline, world_size, source)
    if "rl_model" not in opts.sources and all(s.key != OPTION_KEYS["rl_model"] for s in settings):
        # never replay on the default tiny model by accident
        raise ConfigError(
            f"{source}: no model preset has the architecture of baseline {baseline.name!r} "
            f"({baseline.model.name}); give --rl-model (a preset or a model directory with it)"
        )
    return replay_overrides(settings, f"{source} {baseline.name}")
