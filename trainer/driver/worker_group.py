"""Ray placement of the workers and the calls that fan out to them.

One placement group holds a bundle per worker ({"CPU": 1}, plus {"GPU": 1} on GPU); it is packed onto
one node, or spread over nodes when trainer.nnodes > 1. Placement that the cluster cannot satisfy is an
error that says what was asked and what the cluster has, not an endless wait.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from trainer.config import Config
from trainer.workers.train_worker import TrainWorker

PLACEMENT_TIMEOUT_S = 120.0


class WorkerGroup:
    def __init__(self, cfg: Config) -> None:
        if not ray.is_initialized():
            raise RuntimeError("Ray is not initialised: call ray.init() (or use the rl_cluster fixture) first")
        self.cfg = cfg
        self.world_size = cfg.world_size
        on_gpu = cfg.trainer.device == "cuda"
        bundle = {"CPU": 1.0, "GPU": 1.0} if on_gpu else {"CPU": 1.0}
        strategy = "SPREAD" if cfg.trainer.nnodes > 1 else "PACK"
        self.pg = placement_group([dict(bundle) for _ in range(self.world_size)], strategy=strategy)
        ready, _ = ray.wait([self.pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            remove_placement_group(self.pg)
            raise RuntimeError(
                f"could not place {self.world_size} workers of {bundle} each "
                f"(trainer.nnodes={cfg.trainer.nnodes} x trainer.n_gpus_per_node={cfg.trainer.n_gpus_per_node}) "
                f"within {PLACEMENT_TIMEOUT_S:.0f} s; the cluster has {ray.available_resources()} available"
            )
        remote_cls = ray.remote(TrainWorker)
        self.workers = [
            remote_cls.options(
                num_cpus=1,
                num_gpus=1 if on_gpu else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i),
            ).remote(cfg, i, self.world_size)
            for i in range(self.world_size)
        ]
        master_addr, master_port = ray.get(self.workers[0].address.remote())
        self.info: list[dict[str, Any]] = ray.get([w.setup.remote(master_addr, master_port) for w in self.workers])

    def all(self, method: str, *args: Any) -> list[Any]:
        """Call ``method`` with the same arguments on every worker; wait for all results."""
        return ray.get([getattr(w, method).remote(*args) for w in self.workers])

    def each(self, method: str, per_worker_args: list[tuple[Any, ...]]) -> list[Any]:
        """Call ``method`` on worker i with ``per_worker_args[i]``; wait for all results."""
        return ray.get([getattr(w, method).remote(*a) for w, a in zip(self.workers, per_worker_args, strict=True)])

    def rank0(self, method: str, *args: Any) -> Any:
        return ray.get(getattr(self.workers[0], method).remote(*args))

    def shutdown(self) -> None:
        try:
            ray.get([w.shutdown.remote() for w in self.workers], timeout=30)
        except Exception:  # a dead worker must not stop the clean-up of the others
            pass
        for w in self.workers:
            ray.kill(w)
        remove_placement_group(self.pg)
