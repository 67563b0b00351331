"""``python -m trainer KEY=VALUE ...``: train with VERL-style overrides, as VERL's GRPO examples are run.

    python -m trainer algorithm.adv_estimator=grpo data.train_batch_size=8 \\
        actor_rollout_ref.rollout.n=4 trainer.total_training_steps=3

Ray: RAY_ADDRESS if set, else a local Ray started (and stopped) here. Without data.train_files the
synthetic math set is generated. Each step prints VERL's timing keys (trainer.logger=console).
Installed as the console script ``rlbench-train`` too (pyproject.toml, [project.scripts]).
``--help`` lists every config key by section, read from the config's own definitions
(``trainer.config.KEY_TYPES`` and ``Config()``'s defaults), so the list cannot drift from the code.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import typing
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from trainer.config import (
    ACCEPTED_NO_EFFECT,
    FIXED_CHOICES,
    KEY_TYPES,
    Config,
    ConfigError,
    build_config,
    get_value,
    settings_without_effect,
)
from trainer.config.validation import CHOICE_KEYS
from trainer.phases import PHASE_KEYS


def _type_name(tp: Any) -> str:
    return tp.__name__ if isinstance(tp, type) and not typing.get_args(tp) else str(tp)


def _shown(value: Any) -> str:
    """A default as it would be typed in an override (Hydra's grammar: null, True, [a,b])."""
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(_shown(v) for v in value) + "]"
    return str(value)


def _note(key: str) -> str:
    if key in ACCEPTED_NO_EFFECT:
        return f"  (accepted, no effect here: {ACCEPTED_NO_EFFECT[key]})"
    if key in FIXED_CHOICES:
        return f"  (one of: {', '.join(FIXED_CHOICES[key])})"
    if key in CHOICE_KEYS:  # a registry's names: listing them would import torch for --help
        return "  (a registered name; an unknown one is refused listing them)"
    return ""


def config_sections() -> dict[str, list[str]]:
    """Every config key, grouped by its section (the dotted path above it), in declaration order."""
    sections: dict[str, list[str]] = {}
    for key in KEY_TYPES:
        sections.setdefault(key.rpartition(".")[0], []).append(key)
    return sections


def config_key_help() -> str:
    """The config keys by section, each with its default and type, for ``--help``."""
    defaults = Config()
    lines = ["config keys (KEY=VALUE, VERL's dotted names; default and type shown):"]
    for section, keys in config_sections().items():
        lines += ["", f"{section}:"]
        lines += [
            f"  {key}={_shown(get_value(defaults, key))}  [{_type_name(KEY_TYPES[key])}]{_note(key)}"
            for key in keys
        ]
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trainer",
        description="Run the bundled GRPO trainer with VERL-style KEY=VALUE overrides "
        "(installed as rlbench-train too).",
        epilog=config_key_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the key list keeps its lines
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="VERL dotted overrides (the keys are listed below)"
    )
    parser.add_argument("--workdir", default=None, help="where generated data goes (default: a temp dir)")
    parser.add_argument(
        "--ray-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long the Ray cluster at RAY_ADDRESS has to answer (default 30)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg = build_config(args.overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for line in settings_without_effect(cfg):
        print(f"note: {line}", file=sys.stderr)

    from trainer.build import build_trainer, load_dataset, ray_session
    from trainer.driver.checkpoint_lock import CheckpointLockError
    from trainer.driver.ray_probe import RayUnreachableError
    from trainer.driver.tracking import Tracking

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="rlbench-"))
    dataset = load_dataset(cfg, workdir)
    print(dataset.summary(), flush=True)
    log_dir = Path(cfg.trainer.log_dir) / cfg.trainer.project_name / cfg.trainer.experiment_name
    with ExitStack() as stack:
        try:
            stack.enter_context(ray_session(timeout_s=args.ray_timeout, timeout_option="--ray-timeout"))
        except RayUnreachableError as exc:  # a usage problem: one line, no traceback
            print(f"error: RAY_ADDRESS: {exc}", file=sys.stderr)
            return 1
        try:
            trainer = build_trainer(cfg, workdir, dataset, Tracking(cfg.trainer.logger, log_dir))
        except CheckpointLockError as exc:  # another run saves there: a usage problem, as above
            print(f"error: {exc}", file=sys.stderr)
            return 1
        try:
            resumed = trainer.resume()
            if resumed:
                print(f"resumed from step {resumed}", flush=True)
            results = trainer.fit()
            if results:
                last = results[-1].timing_s
                print(
                    "last step timings (s): "
                    + ", ".join(f"{k}={last[k]:.3f}" for k in PHASE_KEYS if k in last)
                )
        finally:
            trainer.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
