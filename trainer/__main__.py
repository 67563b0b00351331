"""``python -m trainer KEY=VALUE ...``: train with VERL-style overrides, as VERL's GRPO examples are run.

    python -m trainer algorithm.adv_estimator=grpo data.train_batch_size=8 \\
        actor_rollout_ref.rollout.n=4 trainer.total_training_steps=3

Ray: RAY_ADDRESS if set, else a local Ray started (and stopped) here. Without data.train_files the
synthetic math set is generated. Each step prints the seed's timing keys (trainer.logger=console).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from trainer.config import ConfigError, build_config, settings_without_effect
from trainer.phases import PHASE_KEYS


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trainer",
        description="Run the bundled GRPO trainer with VERL-style KEY=VALUE overrides.",
    )
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="VERL dotted overrides")
    parser.add_argument("--workdir", default=None, help="where generated data goes (default: a temp dir)")
    parser.add_argument(
        "--ray-timeout", type=float, default=None, metavar="SECONDS",
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
                print("last step timings (s): " + ", ".join(f"{k}={last[k]:.3f}" for k in PHASE_KEYS if k in last))
        finally:
            trainer.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
