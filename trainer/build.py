"""The one place that builds a trainer: config, tokenizer, data set, Ray, then ``GRPOTrainer``.

Every caller goes through here: ``python -m trainer``, the pytest plugin's ``rl_trainer`` fixture and
anything under benchmarks/. So a figure measured by the suites and a run of ``python -m trainer``
with the same overrides exercise exactly the same set-up.

    cfg = build_config(["data.train_batch_size=8", "actor_rollout_ref.rollout.n=4"])
    with ray_session():
        trainer = build_trainer(cfg, workdir)
        trainer.fit()
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainer.config import Config
    from trainer.data.loader import PromptDataset
    from trainer.driver.grpo_trainer import GRPOTrainer
    from trainer.driver.tracking import Tracking


def load_dataset(cfg: Config, workdir: str | Path) -> PromptDataset:
    """The training prompts that ``cfg.data`` names (the synthetic set, written into ``workdir``, when
    data.train_files is empty), tokenized with the model's tokenizer and validated whole."""
    from trainer.data.source import load_train_dataset
    from trainer.models.presets import load_tokenizer

    return load_train_dataset(cfg.data, load_tokenizer(cfg.actor_rollout_ref.model.path), workdir)


@contextmanager
def ray_session(
    address: str | None = None,
    num_cpus: int | None = None,
    timeout_s: float | None = None,
    timeout_option: str = "ray_session(timeout_s=...)",
) -> Iterator[bool]:
    """Ray for the trainer's workers; yields whether this call started it.

    An already initialised Ray is used as it is. Otherwise ``address`` (else RAY_ADDRESS) is joined
    once a head node answers there (within ``timeout_s``, default 30 s; else RayUnreachableError
    naming the address and ``timeout_option``), or a new local Ray is started on 127.0.0.1. What
    this call started or joined is shut down on exit, every process of a local Ray included."""
    from trainer.driver.ray_local import init_local_ray, use_loopback
    from trainer.driver.ray_probe import DEFAULT_CONNECT_TIMEOUT_S, wait_for_ray
    from trainer.driver.ray_processes import ray_descendants, stop_ray

    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None:
        use_loopback()  # before Ray reads its constants: an embedded Ray listens on 127.0.0.1 only
    import ray

    if ray.is_initialized():
        yield False
        return
    spare = ray_descendants()
    try:
        if address is not None:
            deadline_s = DEFAULT_CONNECT_TIMEOUT_S if timeout_s is None else timeout_s
            wait_for_ray(address, deadline_s, timeout_option)
            ray.init(address=address, log_to_driver=False)
        else:
            init_local_ray(num_cpus=num_cpus)
        yield True
    finally:
        stop_ray(spare)


def build_trainer(
    cfg: Config,
    workdir: str | Path,
    dataset: PromptDataset | None = None,
    tracking: Tracking | None = None,
) -> GRPOTrainer:
    """A ``GRPOTrainer`` with its workers placed on the running Ray (see ``ray_session``).

    dataset: already loaded prompts (the plugin loads them at start-up to report a bad file before any
    worker starts); by default ``load_dataset(cfg, workdir)``."""
    from trainer.driver.grpo_trainer import GRPOTrainer

    if dataset is None:
        dataset = load_dataset(cfg, workdir)
    return GRPOTrainer(cfg, dataset, tracking)
