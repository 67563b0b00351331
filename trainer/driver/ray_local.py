"""Keep a Ray started on this machine on the loopback address.

Ray's default is the machine's outward IP. Setting RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before Ray
reads its constants (and in the environment that Ray's own processes inherit) keeps every process of
a local Ray, and of a ``ray.cluster_utils.Cluster``, on 127.0.0.1.

``init_local_ray`` also starts the watchdog of ``ray_watchdog``, which ends the local Ray's processes
should this process be killed without stopping them; ``stop_watchdog`` ends it after an orderly stop.
"""

from __future__ import annotations

import os
import sys

from trainer.driver.ray_watchdog import MARK_ENV, Watchdog

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def use_loopback() -> None:
    """Make Ray (in this process and those it starts) use 127.0.0.1 as this node's address."""
    os.environ[LOOPBACK_ENV] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:  # Ray was imported before: its constant was read already
        constants.ENABLE_RAY_CLUSTER = False


# Ray starts its workers at nice 15 (its worker_niceness), below its own raylet, GCS and agents and
# the driver. Our workers run the timed phases, so on a small CPU machine every burst of Ray's
# background work preempted them: six sessions of the embedded default on 2 cores spread
# old_log_prob's median by 1.41x at nice 15 and 1.14x at nice 0. A user's own setting is kept.
WORKER_NICENESS_ENV = "RAY_worker_niceness"


_watchdog: Watchdog | None = None


def init_local_ray(num_cpus: int | None = None, **kwargs) -> None:
    """Start a new single-node Ray on 127.0.0.1 (never attach to a leftover one), its workers at the
    driver's priority, and a watchdog that ends its processes should this one be killed."""
    global _watchdog
    use_loopback()
    os.environ.setdefault(WORKER_NICENESS_ENV, "0")  # read by the raylet this call starts
    import ray

    stop_watchdog()
    before = os.environ.get(MARK_ENV)
    if sys.platform.startswith("linux"):  # the watchdog reads /proc
        _watchdog = Watchdog()
        os.environ[MARK_ENV] = _watchdog.mark  # inherited by the GCS and raylet that ray.init starts
    try:
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            log_to_driver=kwargs.pop("log_to_driver", False),
            **kwargs,
        )
    finally:  # later children of this process are not Ray's
        if before is None:
            os.environ.pop(MARK_ENV, None)
        else:
            os.environ[MARK_ENV] = before


def stop_watchdog() -> None:
    """End the watchdog of the local Ray this process started (once that Ray is stopped)."""
    global _watchdog
    if _watchdog is not None:
        _watchdog.stop()
        _watchdog = None
