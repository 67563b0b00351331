"""The plugin's options: what each one means, and how raw values become ``RLBenchOptions``.

Pure parsing: nothing here imports pytest or starts anything, so every rule can be tested on plain
values. The table of options is ``option_table.OPTIONS``; ``plugin.py`` registers it with pytest
(command line and ini), reads the raw values (the command line wins over the ini file) and turns an
``OptionError`` into ``pytest.UsageError``.
Single values are parsed in ``option_values``, names checked in ``option_checks``; the dedicated
options are sugar for trainer overrides (``config_path``), which the whole set is validated with.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_rlbench import option_values as values
from pytest_rlbench.config_path import (
    OPTION_KEYS,
    build_trainer_config,
    given_in_config,
    option_overrides,
    option_value,
    refuse_given_twice,
    user_overrides,
)
from pytest_rlbench.frameworks import OURS
from pytest_rlbench.metrics import DEFAULT_TOLERANCE, default_tolerance
from pytest_rlbench.option_checks import (
    DEFAULT_MODEL,
    check_baseline,
    check_dataset,
    check_model,
    check_rollouts,
    check_trainers,
)
from pytest_rlbench.option_table import (
    DEFAULT_ROLLOUT,
    DEFAULT_ROUNDS,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WARMUP_ROUNDS,
    PROGRESS_MODES,
    SPECS,
)
from pytest_rlbench.option_values import OptionError, RawValue
from trainer.config import ConfigError, Override
from trainer.config.schema import TrainerSection


@dataclass(frozen=True)
class RLBenchOptions:
    """The parsed options. Defaults are those of a plain ``pytest suites/`` run.

    gpus_per_node None means "all visible GPUs" (resolved against the cluster at session start);
    ray_address None means an embedded local Ray; dataset None means the synthetic math set."""

    nodes: int = 1
    gpus_per_node: int | None = None
    gpu: bool = False
    ray_address: str | None = None
    ray_address_source: str = "embedded"  # which option or variable gave ray_address
    model: str = DEFAULT_MODEL
    dataset: Path | None = None
    rollout: str = DEFAULT_ROLLOUT  # the trainer's engine: the first --rl-rollout
    rollout_panel: tuple[str, ...] = ()  # the further --rl-rollout engines, compared with it (docs/fidelity.md)
    config_overrides: tuple[str, ...] = ()  # --rl-config as given (ini file's first)
    # What the trainer config is built from: the ini file's rl_config overrides (the suites' default
    # work, which a replayed workload replaces), then the options' and the command line's --rl-config.
    ini_overrides: tuple[Override, ...] = ()
    overrides: tuple[Override, ...] = ()
    baselines: tuple[str, ...] = ()
    workload: str | None = None  # a baseline whose work per GPU the run replays (--rl-workload)
    tolerance: float = DEFAULT_TOLERANCE
    max_mismatch: float | None = None  # --rl-max-mismatch: the limit on token_mult_prob_error
    rounds: int = DEFAULT_ROUNDS
    warmup_rounds: int = DEFAULT_WARMUP_ROUNDS
    report: Path | None = None
    save_baseline: Path | None = None
    ray_timeout: float = DEFAULT_TIMEOUT_S
    phase_timeout: float = TrainerSection.phase_timeout_s
    # The frameworks whose trainers the suites run (--rl-trainer, in order): with several, every test
    # that uses the trainer runs once per framework (ids [ours], [trl]) and each has its own record.
    trainers: tuple[str, ...] = (OURS,)
    progress: str = PROGRESS_MODES[0]  # --rl-progress: auto, on, off
    sources: Mapping[str, str] = field(default_factory=dict)  # dest -> where the value came from

    @property
    def trainer(self) -> str:
        """The first framework: the one whose record is the report's top level and keeps the
        --rl-save-baseline path as given."""
        return self.trainers[0]

    @property
    def embedded(self) -> bool:
        return self.ray_address is None

    def source_of(self, dest: str) -> str:
        """How messages name an option: as the user gave it, else by its flag."""
        return self.sources.get(dest, SPECS[dest].flag if dest in SPECS else dest)

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "gpu": self.gpu,
            "ray_address": self.ray_address,
            "model": self.model,
            "dataset": str(self.dataset) if self.dataset else None,
            "rollout": self.rollout,
            "rollout_panel": list(self.rollout_panel),
            "config_overrides": list(self.config_overrides),
            "baselines": list(self.baselines),
            "workload": self.workload,
            "tolerance": float(self.tolerance),  # a number: what the verdicts apply (the default's too)
            "max_mismatch": self.max_mismatch,
            "rounds": self.rounds,
            "warmup_rounds": self.warmup_rounds,
            "report": str(self.report) if self.report else None,
            "save_baseline": str(self.save_baseline) if self.save_baseline else None,
            "trainer": self.trainer,
            "trainers": list(self.trainers),
        }


# ----------------------------------------------------------------------------- the whole set
def parse_options(
    raw: Mapping[str, RawValue | None],
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> RLBenchOptions:
    """Turn raw values (keyed by destination, e.g. ``rl_nodes``; None when not given) into options.

    Raises OptionError naming the option and what would be valid. ``environ`` supplies RAY_ADDRESS."""
    environ = os.environ if environ is None else environ
    cwd = Path.cwd() if cwd is None else cwd
    unknown = sorted(set(raw) - set(SPECS))
    if unknown:
        raise ValueError(f"unknown option destinations {unknown}; known: {sorted(SPECS)}")

    def get(dest: str) -> RawValue | None:
        value = raw.get(dest)
        if (
            value is None
            or value.value is None
            or (isinstance(value.value, (list, tuple)) and not value.value)
        ):
            return None
        return value

    sources = {dest: value.source for dest in SPECS if (value := get(dest)) is not None}

    config_raw = get("rl_config")
    config_texts = tuple(str(v) for v in config_raw.value) if config_raw else ()
    config_source = config_raw.source if config_raw else SPECS["rl_config"].flag
    user, scratch = user_overrides(config_texts, config_source)
    ini_count = config_raw.ini_count if config_raw else 0  # the ini file's come first

    def own(dest: str, parse: Callable[[RawValue], Any], check: Callable[[Any, str], Any], default: Any) -> Any:
        """The option's value: given, or from a --rl-config override of its key (checked the same
        way and counted as the option), else ``default``. Both given: one key given twice."""
        r = get(dest)
        if r is not None:
            shown = r.source if SPECS[dest].kind == "flag" else f"{r.source}={values.text_of(r)}"
            refuse_given_twice(dest, shown, user)
            return parse(r)
        override = given_in_config(dest, user)
        if override is None:
            return default
        sources[dest] = override.source
        return check(option_value(dest, scratch), f"{config_source} {override.key}")

    def one_file(files: list[str], source: str) -> Path | None:
        if len(files) > 1:
            raise OptionError(
                f"{source}: expected one training file, got {len(files)}; give one with --rl-dataset"
            )
        return check_dataset(values.path(RawValue(files[0], source, cwd)), source) if files else None

    def count(what: str) -> Callable[[Any, str], int]:
        return lambda v, src: values.positive_int(RawValue(v, src, cwd), what)

    # --gpu first: it decides whether trainer.n_gpus_per_node is owned.
    gpu = own("rl_gpu", values.flag, lambda v, _: v == "cuda", False)
    nodes = own("rl_nodes", lambda r: values.positive_int(r, "Ray nodes"), count("Ray nodes"), 1)
    gpus_per_node = None
    if gpu:
        gpus_per_node = own(
            "rl_gpus_per_node", lambda r: values.positive_int(r, "GPUs per node"), count("GPUs per node"), None
        )
    elif (r := get("rl_gpus_per_node")) is not None:
        # An error rather than ignoring it: the user expects GPUs and would silently get CPU workers.
        raise OptionError(
            f"{r.source}={values.positive_int(r, 'GPUs per node')} needs --gpu (without it the workers run "
            "on CPU; set CPU workers per node with --rl-config trainer.n_gpus_per_node=N)"
        )
    model = own(
        "rl_model",
        lambda r: check_model(values.text_of(r), r.source, r.base_dir),
        lambda v, src: check_model(str(v), src, cwd),
        DEFAULT_MODEL,
    )
    rollout, *panel = own(
        "rl_rollout",
        lambda r: check_rollouts(values.texts_of(r), r.source),
        lambda v, src: check_rollouts([str(v)], src),
        (DEFAULT_ROLLOUT,),
    )
    dataset = own("rl_dataset", lambda r: check_dataset(values.path(r), r.source), one_file, None)
    phase_timeout = own(
        "rl_phase_timeout",
        lambda r: values.seconds(r, "a phase timeout"),
        lambda v, src: values.seconds(RawValue(v, src, cwd), "a phase timeout"),
        TrainerSection.phase_timeout_s,
    )

    address: str | None = None
    address_source = "embedded"
    if (r := get("rl_ray_address")) is not None:
        address, address_source = values.ray_address(r), r.source
    elif environ.get("RAY_ADDRESS", "").strip():
        env_raw = RawValue(environ["RAY_ADDRESS"], "RAY_ADDRESS", cwd)
        address, address_source = values.ray_address(env_raw), "RAY_ADDRESS"
    if address is None:
        address_source = "embedded"

    baselines: tuple[str, ...] = ()
    if (r := get("rl_baseline")) is not None:
        baselines = tuple(check_baseline(r, str(v).strip()) for v in r.value if str(v).strip())

    workload = check_baseline(r, values.text_of(r)) if (r := get("rl_workload")) is not None else None

    owned = {"rl_gpu": gpu, "rl_nodes": nodes, "rl_gpus_per_node": gpus_per_node, "rl_model": model}
    owned.update(rl_rollout=rollout, rl_dataset=dataset, rl_phase_timeout=phase_timeout)
    folded = {OPTION_KEYS[dest] for dest in owned if dest in sources}  # now set by the options' overrides
    opts = RLBenchOptions(
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        gpu=gpu,
        ray_address=address,
        ray_address_source=address_source,
        model=model,
        dataset=dataset,
        rollout=rollout,
        rollout_panel=tuple(panel),
        config_overrides=config_texts,
        ini_overrides=tuple(o for o in user[:ini_count] if o.key not in folded),
        overrides=(*option_overrides(owned, sources), *(o for o in user[ini_count:] if o.key not in folded)),
        baselines=baselines,
        workload=workload,
        tolerance=values.tolerance(r) if (r := get("rl_tolerance")) else default_tolerance(gpu),
        max_mismatch=values.mismatch_limit(r) if (r := get("rl_max_mismatch")) else None,
        rounds=values.positive_int(r, "rounds") if (r := get("rl_rounds")) else DEFAULT_ROUNDS,
        warmup_rounds=(
            values.non_negative_int(r, "rounds") if (r := get("rl_warmup_rounds")) else DEFAULT_WARMUP_ROUNDS
        ),
        report=values.output_path(r) if (r := get("rl_report")) else None,
        save_baseline=values.output_path(r) if (r := get("rl_save_baseline")) else None,
        ray_timeout=values.seconds(r, "a timeout") if (r := get("rl_ray_timeout")) else DEFAULT_TIMEOUT_S,
        phase_timeout=phase_timeout,
        trainers=check_trainers(r.value, r.source) if (r := get("rl_trainer")) else (OURS,),
        progress=values.progress_mode(r) if (r := get("rl_progress")) else PROGRESS_MODES[0],
        sources=sources,
    )
    # Cross-field checks of the composed trainer config (batch sizes against workers, ...). With
    # --gpu and no --rl-gpus-per-node the GPU count is known only at session start: 1 stands in.
    # Names that registries hold are checked when the session builds the config for the tests that
    # use it (still before any test runs): reading a registry imports torch, which a run of plain
    # tests with the plugin loaded must not pay.
    if opts.workload and opts.gpu and opts.gpus_per_node is None:
        # A replay's work per GPU needs the GPU count, known at session start: the whole config is
        # checked there (still before any test runs), since without the replay it is not the run's.
        return opts
    try:
        build_trainer_config(opts, check_names=False)
    except ConfigError as exc:
        raise OptionError(
            f"the trainer config from the --rl-* options and {config_source} is invalid: {exc}"
        ) from None
    return opts
