"""Ray placement of the workers, the calls that fan out to them, and what happens when one fails.

One placement group holds a bundle per worker ({"CPU": 1}, plus {"GPU": 1} on GPU); it is packed onto
one node, or spread over nodes when trainer.nnodes > 1. Placement that the cluster cannot satisfy is an
error that says what was asked and what the cluster has, not an endless wait.

Every wait for the workers is bounded by trainer.phase_timeout_s. A worker that dies, or that does
not answer within that time (hung, or stopped), fails the phase with a ``WorkerFailure`` naming the
phase and the worker's rank and node; the whole group is then killed at once (the others would wait
in a collective for the missing one), and every later call fails at once with one line.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from trainer.config import Config, ConfigError
from trainer.driver.ray_processes import pid_state
from trainer.work_counts import WorkCounts
from trainer.workers.train_worker import TrainWorker

PLACEMENT_TIMEOUT_S = 120.0
SHUTDOWN_TIMEOUT_S = 30.0


class WorkerFailure(RuntimeError):
    """A worker died or hung during a phase; the message names the phase, the rank and the node."""


def phase_timeout(cfg: Config) -> float:
    value = cfg.trainer.phase_timeout_s
    if not (isinstance(value, (int, float)) and 0 < value < math.inf):
        raise ConfigError(f"trainer.phase_timeout_s must be a number of seconds > 0, got {value!r}")
    return float(value)


class WorkerGroup:
    def __init__(self, cfg: Config) -> None:
        if not ray.is_initialized():
            raise RuntimeError("Ray is not initialised: call ray.init() (or use the rl_cluster fixture) first")
        self.cfg = cfg
        self.world_size = cfg.world_size
        self.timeout_s = phase_timeout(cfg)
        self.failure: str | None = None
        self.info: list[dict[str, Any]] = []
        self.counted: list[WorkCounts] | None = None  # while counting: the workers' counted work
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
        master_addr, master_port = self.wait([self.workers[0].address.remote()], "setup", ranks=[0])[0]
        self.info = self.wait([w.setup.remote(master_addr, master_port) for w in self.workers], "setup")

    def all(self, method: str, *args: Any, phase: str | None = None) -> list[Any]:
        """Call ``method`` with the same arguments on every worker; wait for all results.

        phase: what a failure names (the phase's timing key); ``method`` by default."""
        return self.wait([self._remote(w, method, *args) for w in self.workers], phase or method)

    def each(self, method: str, per_worker_args: list[tuple[Any, ...]], phase: str | None = None) -> list:
        """Call ``method`` on worker i with ``per_worker_args[i]``; wait for all results."""
        refs = [self._remote(w, method, *a) for w, a in zip(self.workers, per_worker_args, strict=True)]
        return self.wait(refs, phase or method)

    def rank0(self, method: str, *args: Any, phase: str | None = None) -> Any:
        return self.wait([self._remote(self.workers[0], method, *args)], phase or method, ranks=[0])[0]

    # ------------------------------------------------------------------ counted work
    @contextmanager
    def counting(self) -> Iterator[list[WorkCounts]]:
        """While active, every call through ``all``, ``each`` and ``rank0`` runs under the workers'
        counters (``TrainWorker.counted``); the yielded list gets one WorkCounts per worker call."""
        self.counted = []
        try:
            yield self.counted
        finally:
            self.counted = None

    def _remote(self, worker: Any, method: str, *args: Any) -> Any:
        if self.counted is None:
            return getattr(worker, method).remote(*args)
        return worker.counted.remote(method, *args)

    # ------------------------------------------------------------------ waiting and failing
    def wait(self, refs: list[Any], phase: str, ranks: list[int] | None = None) -> list[Any]:
        """The results of ``refs`` (one per rank in ``ranks``, default all), within the phase timeout.

        A dead or silent worker fails the group: WorkerFailure naming the phase, rank and node."""
        if self.failure is not None:
            raise WorkerFailure(f"phase {phase}: the workers are shut down: {self.failure}")
        ranks = list(range(len(refs))) if ranks is None else ranks
        try:
            results = ray.get(refs, timeout=self.timeout_s)
            if self.counted is None:
                return results
            self.counted.extend(work for _, work in results)
            return [result for result, _ in results]
        except GetTimeoutError:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            late = [rank for rank, ref in zip(ranks, refs, strict=True) if ref not in ready]
            reason = (
                f"phase {phase} did not finish within {self.timeout_s:g} s (trainer.phase_timeout_s): "
                f"no answer from {', '.join(self.describe(rank) for rank in late)}"
            )
        except RayActorError as exc:
            dead = [rank for rank, ref in zip(ranks, refs, strict=True) if _died(ref)] or ranks
            cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            reason = (
                f"{', '.join(self.describe(rank) for rank in dead)} died during phase {phase} "
                f"({type(exc).__name__}: {cause})"
            )
        self.fail(reason)
        raise WorkerFailure(f"{reason}; all {self.world_size} workers were shut down") from None

    def describe(self, rank: int) -> str:
        """'worker rank 1 (pid 4242 on node 10.0.0.2, host gpu-2; the process is stopped)'."""
        info = self.info[rank] if rank < len(self.info) else {}
        if not info:
            return f"worker rank {rank}"
        where = f"pid {info.get('pid')} on node {info.get('node_ip')}, host {info.get('host')}"
        if info.get("host") == socket.gethostname() and pid_state(int(info.get("pid", 0))) in ("T", "t"):
            where += "; the process is stopped (SIGSTOP?)"
        return f"worker rank {rank} ({where})"

    def fail(self, reason: str) -> None:
        """Kill every worker now (a collective would keep the others waiting) and refuse later calls."""
        self.failure = reason
        self._kill()

    def _kill(self) -> None:
        for w in self.workers:
            try:
                ray.kill(w)
            except Exception:  # already gone
                pass
        remove_placement_group(self.pg)

    def shutdown(self) -> None:
        if not ray.is_initialized():  # Ray stopped first: the workers went with it (never start a new one)
            return
        if self.failure is not None:
            return  # killed when the failure was found
        try:
            ray.get([w.shutdown.remote() for w in self.workers], timeout=SHUTDOWN_TIMEOUT_S)
        except Exception:  # a dead worker must not stop the clean-up of the others
            pass
        self.failure = "WorkerGroup.shutdown was called"
        self._kill()


def _died(ref: Any) -> bool:
    try:
        ray.get(ref, timeout=0)
    except RayActorError:
        return True
    except Exception:  # not finished (blocked on the dead one), or an ordinary error
        return False
    return False
