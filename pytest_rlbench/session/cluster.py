"""The Ray cluster a benchmark session runs on: connect or start one, describe it, check it.

``RayConnection.open`` either attaches this process to a running cluster (``--rl-ray-address`` or
RAY_ADDRESS) or starts an embedded single-node Ray on 127.0.0.1; ``close`` undoes exactly that (an
embedded Ray is stopped, a connection to someone else's cluster is only dropped), and stops every Ray
process it started, so none is left running after the session, an interrupted one included.
An address is probed with a deadline (``--rl-ray-timeout``) before ``ray.init`` is called, which
would otherwise retry an unreachable one for many minutes. ``describe`` reads
what the cluster has from Ray's node table; ``check_cluster`` compares it with what was asked for.
The describing and checking functions are pure, so they are tested on plain values.
"""

from __future__ import annotations

import atexit
import logging
import platform
import signal
import socket
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from trainer.driver.ray_local import init_local_ray, use_loopback
from trainer.driver.ray_probe import DEFAULT_CONNECT_TIMEOUT_S, wait_for_ray
from trainer.driver.ray_processes import ray_descendants, stop_ray

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
NAMESPACE = "rlbench"
SHORT_ID = 12  # node ids are 56 hex digits; messages show a prefix


class ClusterError(RuntimeError):
    """The cluster cannot be reached or does not have what the options ask for."""


@dataclass(frozen=True)
class NodeInfo:
    """One alive Ray node, as its resources describe it."""

    node_id: str
    ip: str
    hostname: str
    cpus: float
    gpus: float
    gpu_model: str | None
    memory_bytes: int  # Ray's schedulable "memory" resource on the node
    object_store_bytes: int
    is_head: bool

    @property
    def short_id(self) -> str:
        return self.node_id[:SHORT_ID]

    def describe(self) -> str:
        return f"{self.short_id} at {self.ip}"


@dataclass(frozen=True)
class ClusterInfo:
    """What a benchmark report records about where it ran (alive nodes only)."""

    address: str
    embedded: bool
    nodes: tuple[NodeInfo, ...]
    cpu_model: str  # of the machine running pytest (the driver)
    hostname: str
    ray_version: str
    torch_version: str

    @property
    def node_count(self) -> int:
        return len(self.nodes)

    @property
    def gpu_models(self) -> list[str]:
        return sorted({n.gpu_model for n in self.nodes if n.gpu_model})

    @property
    def total_gpus(self) -> int:
        return int(sum(n.gpus for n in self.nodes))

    def where(self) -> str:
        return "the embedded local Ray" if self.embedded else f"the cluster at {self.address}"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["nodes"] = [asdict(n) for n in self.nodes]
        out["node_count"] = self.node_count
        return out


# ----------------------------------------------------------------------------- describing (pure)
def accelerator_type(resources: Mapping[str, float], labels: Mapping[str, str] | None = None) -> str | None:
    """The GPU model Ray detected on a node ("H100"), from its accelerator_type:X resource or label."""
    for key in resources:
        if key.startswith("accelerator_type:"):
            return key.split(":", 1)[1]
    if labels:
        return labels.get("ray.io/accelerator-type") or None
    return None


def describe_nodes(
    raw_nodes: Sequence[Mapping[str, Any]],
    local_ip: str | None = None,
    local_gpu_model: str | None = None,
) -> tuple[NodeInfo, ...]:
    """NodeInfo for each alive node of ``ray.nodes()``, head first.

    local_gpu_model names the GPUs of the node at ``local_ip`` (this machine, seen by torch) where
    Ray did not detect their model."""
    out = []
    for node in raw_nodes:
        if not node.get("Alive", node.get("alive", False)):
            continue
        res: Mapping[str, float] = node.get("Resources", {})
        gpus = float(res.get("GPU", 0.0))
        model = accelerator_type(res, node.get("Labels"))
        ip = str(node.get("NodeManagerAddress", ""))
        if model is None and gpus > 0 and ip == local_ip:
            model = local_gpu_model
        out.append(
            NodeInfo(
                node_id=str(node["NodeID"]),
                ip=ip,
                hostname=str(node.get("NodeManagerHostname", "")),
                cpus=float(res.get("CPU", 0.0)),
                gpus=gpus,
                gpu_model=model,
                memory_bytes=int(res.get("memory", 0)),
                object_store_bytes=int(res.get("object_store_memory", 0)),
                is_head="node:__internal_head__" in res,
            )
        )
    out.sort(key=lambda n: (not n.is_head, n.ip, n.node_id))
    return tuple(out)


def cpu_model() -> str:
    """The CPU model of this machine, from /proc/cpuinfo where there is one."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def local_gpu_count() -> int:
    """The GPUs torch sees on this machine, counted without starting CUDA in this process: the driver
    leaves the GPUs to its workers (a CUDA context here would take memory on one of theirs, and make
    the driver's counted work start torch's GPU profiler)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def local_gpu_model() -> str | None:
    """The model of this machine's first GPU ("NVIDIA H100 80GB HBM3"). This starts CUDA in this
    process: asked only where Ray did not name the model of a GPU node on this machine."""
    import torch

    return torch.cuda.get_device_name(0) if local_gpu_count() else None


# ----------------------------------------------------------------------------- checking (pure)
def _gpu_table(nodes: Sequence[NodeInfo]) -> str:
    return ", ".join(f"{n.describe()}: {n.gpus:g}" for n in nodes) or "no alive nodes"


def check_cluster(
    info: ClusterInfo,
    nodes: int,
    gpu: bool,
    gpus_per_node: int | None,
    nodes_source: str = "--rl-nodes",
    gpus_source: str = "--rl-gpus-per-node",
) -> str | None:
    """None if the cluster has what was asked for, else a message saying what was asked and found.

    Asked for: ``nodes`` alive nodes and, with ``gpu``, that many nodes with at least
    ``gpus_per_node`` GPUs each (None: at least one)."""
    ids = ", ".join(n.describe() for n in info.nodes) or "none"
    if info.node_count < nodes:
        return (
            f"{nodes_source}={nodes} asks for {nodes} alive Ray nodes; {info.where()} has "
            f"{info.node_count} (node ids {ids})"
        )
    if gpu:
        need = gpus_per_node or 1
        fit = [n for n in info.nodes if n.gpus >= need]
        if len(fit) < nodes:
            asked = f"{gpus_source}={gpus_per_node}" if gpus_per_node else "--gpu"
            return (
                f"{asked} asks for {nodes} node(s) with at least {need} GPU(s) each; {info.where()} has "
                f"{len(fit)} such node(s) (GPUs per node: {_gpu_table(info.nodes)})"
            )
    return None


def resolve_gpus_per_node(info: ClusterInfo, nodes: int) -> int:
    """ "All visible GPUs": the GPU count of the smallest of the ``nodes`` best-equipped nodes."""
    counts = sorted((int(n.gpus) for n in info.nodes), reverse=True)[:nodes]
    return min(counts) if counts else 0


def precheck_embedded(
    nodes: int,
    gpu: bool,
    gpus_per_node: int | None,
    visible_gpus: int,
    nodes_source: str = "--rl-nodes",
    gpus_source: str = "--rl-gpus-per-node",
) -> str | None:
    """What an embedded Ray could never satisfy, found without starting it (it is one node, this
    machine, with the GPUs torch sees here)."""
    if nodes > 1:
        return (
            f"{nodes_source}={nodes} asks for {nodes} alive Ray nodes; the embedded local Ray has 1 "
            f"(this machine, {socket.gethostname()}); give --rl-ray-address or RAY_ADDRESS of a cluster "
            f"with {nodes} nodes"
        )
    if gpu:
        need = gpus_per_node or 1
        if visible_gpus < need:
            asked = f"{gpus_source}={gpus_per_node}" if gpus_per_node else "--gpu"
            return (
                f"{asked} asks for a node with at least {need} GPU(s); the embedded local Ray would run on "
                f"this machine ({socket.gethostname()}), which has {visible_gpus} visible GPU(s)"
            )
    return None


# ----------------------------------------------------------------------------- the connection
def is_loopback(address: str) -> bool:
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return host in LOOPBACK_HOSTS


class RayConnection:
    """This process's use of Ray for one session; ``close`` undoes only what ``open`` did."""

    def __init__(self, address: str, embedded: bool, owned: bool, spare: tuple[int, ...] = ()) -> None:
        self.address = address
        self.embedded = embedded
        self.owned = owned  # we called ray.init, so we call ray.shutdown
        self.spare = spare  # Ray processes under this one that were running before open: not ours
        self.closed = False

    @classmethod
    def open(
        cls,
        address: str | None,
        num_cpus: int | None = None,
        address_source: str = "--rl-ray-address",
        timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        timeout_source: str = "--rl-ray-timeout",
    ) -> RayConnection:
        """Connect to ``address`` (a head node must answer within ``timeout_s``), or start an embedded
        local Ray (``num_cpus`` logical CPUs) if None."""
        if address is None or is_loopback(address):
            use_loopback()  # before importing Ray; a driver of a loopback cluster must be on 127.0.0.1 too
        import ray

        if ray.is_initialized():  # someone (a conftest, a test) attached already: use it, leave it
            return cls(ray.get_runtime_context().gcs_address, embedded=False, owned=False)
        quiet: dict[str, Any] = dict(log_to_driver=False, logging_level=logging.ERROR, namespace=NAMESPACE)
        spare = tuple(ray_descendants())
        try:
            if address is None:  # always a new instance on 127.0.0.1, its workers at our priority
                init_local_ray(num_cpus=num_cpus, **quiet)
            else:
                wait_for_ray(address, timeout_s, timeout_source)
                ray.init(address=address, **quiet)
        except BaseException as exc:  # ConnectionError, RuntimeError, ValueError: Ray uses several
            stop_ray(spare)  # an interrupted start too: what it started so far must not outlive us
            if isinstance(exc, SystemExit) and exc.code == signal.SIGTERM:
                # ray.init replaces the SIGTERM handler with sys.exit(SIGTERM): treat it as Ctrl-C
                raise KeyboardInterrupt("SIGTERM") from None
            if not isinstance(exc, Exception):
                raise
            where = f"{address_source}={address}" if address else "an embedded local Ray"
            raise ClusterError(f"could not start or reach {where}: {type(exc).__name__}: {exc}") from exc
        conn = cls(ray.get_runtime_context().gcs_address, embedded=address is None, owned=True, spare=spare)
        atexit.register(conn.close)  # a session killed past pytest_sessionfinish still stops its Ray
        return conn

    def describe(self) -> ClusterInfo:
        import ray
        import torch

        raw, here = ray.nodes(), ray.util.get_node_ip_address()
        nodes = describe_nodes(raw, here)
        if any(n.gpus > 0 and n.gpu_model is None and n.ip == here for n in nodes):  # Ray did not say
            nodes = describe_nodes(raw, here, local_gpu_model())
        return ClusterInfo(
            address=self.address,
            embedded=self.embedded,
            nodes=nodes,
            cpu_model=cpu_model(),
            hostname=socket.gethostname(),
            ray_version=ray.__version__,
            torch_version=torch.__version__,
        )

    def close(self) -> None:
        """Stop the embedded Ray, or drop the connection to an external one; idempotent."""
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self.close)
        if self.owned:
            stop_ray(self.spare)
