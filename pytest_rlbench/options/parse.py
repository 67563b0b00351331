"""How raw option values become ``RLBenchOptions`` (``parse_options``).

Pure parsing: nothing here imports pytest or starts anything, so every rule can be tested on plain
values. The table of options is ``options.table.OPTIONS``; ``plugin.py`` registers it with pytest
(command line and ini), reads the raw values (the command line wins over the ini file) and turns an
``OptionError`` into ``pytest.UsageError``.
Single values are parsed in ``options.values``, names checked (and baselines loaded) in
``options.checks``; the dedicated options are sugar for trainer overrides (``options.trainer_config``):
the session builds and checks the trainer config they compose, once (``RLBenchSession.build_config``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pytest_rlbench.frameworks import OURS
from pytest_rlbench.options import values
from pytest_rlbench.options.checks import (
    DEFAULT_MODEL,
    check_dataset,
    check_model,
    check_rollouts,
    check_trainers,
    load_baseline_option,
)
from pytest_rlbench.options.parsed import RLBenchOptions
from pytest_rlbench.options.table import (
    DEFAULT_ROLLOUT,
    DEFAULT_ROUNDS,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WARMUP_ROUNDS,
    PROGRESS_MODES,
    SPECS,
)
from pytest_rlbench.options.trainer_config import (
    OPTION_KEYS,
    given_in_config,
    option_overrides,
    option_value,
    refuse_given_twice,
    user_overrides,
)
from pytest_rlbench.options.values import OptionError, RawValue
from pytest_rlbench.records.record import RunRecord
from pytest_rlbench.verdict.noise import default_tolerance
from trainer.config.schema import TrainerSection


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

    given: list[tuple[str, RunRecord]] = []
    if (r := get("rl_baseline")) is not None:
        given = [load_baseline_option(r, str(v).strip()) for v in r.value if str(v).strip()]
    workload, workload_record = None, None
    if (r := get("rl_workload")) is not None:
        workload, workload_record = load_baseline_option(r, values.text_of(r))
        if workload_record.workload is None:
            raise OptionError(
                f"{r.source}: baseline {workload_record.name!r} records no workload, so its work cannot be "
                "replayed (a baseline saved by this version with --rl-save-baseline, or a stored one, has one)"
            )

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
        baselines=tuple(text for text, _ in given),
        baseline_records=tuple(record for _, record in given),
        workload=workload,
        workload_record=workload_record,
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
    # The trainer config these options compose is built and checked once, by the session
    # (pytest_rlbench.session.fixtures.RLBenchSession.build_config).
    return opts
