"""The data-parallel group of the workers (torch.distributed: gloo on CPU, NCCL on GPU).

With one worker every collective is the identity, so the same training code runs alone or in a
group. Gradients are summed, not averaged: each worker's loss is already weighted by its share of
the global mini-batch (see trainer/workers/actor.py).

The rendezvous (torch.distributed's TCPStore, served by rank 0) listens where rank 0 says, not on
all interfaces: TCPStore binds its server to every interface whatever host it is given, so rank 0
binds the listening socket itself (``Rendezvous``) and hands the store a copy of its descriptor
(``master_listen_fd``), which the store closes when it goes. NCCL's own sockets (its bootstrap and
proxy) listen on the interface NCCL picks, by default the first one that is not loopback; with the
rendezvous on loopback (every worker on one node) they are kept on loopback too (``nccl_socket_env``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from datetime import timedelta

import torch
import torch.distributed as dist

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
NCCL_INTERFACE_ENV = "NCCL_SOCKET_IFNAME"  # NCCL's environment variables, docs.nvidia.com/deeplearning/nccl


def nccl_socket_env(master_addr: str, environ: Mapping[str, str]) -> dict[str, str]:
    """What to add to the environment before NCCL starts: its sockets on the loopback interface when
    the group's rendezvous is on loopback; nothing when the user chose an interface, or for a
    rendezvous on a node's address (NCCL's choice of interface then reaches the other nodes)."""
    if master_addr in LOOPBACK_HOSTS and NCCL_INTERFACE_ENV not in environ:
        return {NCCL_INTERFACE_ENV: "lo"}
    return {}


class Rendezvous:
    """Rank 0's listening socket for the group's TCPStore, bound to ``host`` (a free port by default).

    The store serves on this socket's descriptor: keep the object alive while the group exists."""

    def __init__(self, host: str, port: int = 0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.bind((host, port))
        self.socket.listen()
        self.host = host
        self.port = int(self.socket.getsockname()[1])

    def store_fd(self) -> int:
        """A descriptor of the listening socket for the TCPStore to own: the store's server (libuv's
        ``uv_tcp_open``) closes the descriptor it is handed when the store goes, so it gets its own
        copy; handed this socket's, ``close`` would close that number again, by then perhaps another
        thread's file or socket."""
        return os.dup(self.socket.fileno())

    def close(self) -> None:
        self.socket.close()


class DataParallel:
    """Collectives over the worker group, as plain Python numbers and whole-model gradient buffers."""

    def __init__(self, rank: int = 0, world_size: int = 1, device: torch.device | None = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = device or torch.device("cpu")
        self.rendezvous: Rendezvous | None = None

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def init(
        self,
        master_addr: str,
        master_port: int,
        backend: str,
        timeout_s: float = 600.0,
        force: bool = False,
        rendezvous: Rendezvous | None = None,
    ) -> None:
        """Join the group; with one worker only when ``force`` (FSDP2 needs a group even of one).

        Rank 0 serves the store on its ``rendezvous`` (bound to master_addr:master_port), or binds
        one there now."""
        if not (self.active or force):
            if rendezvous is not None:
                rendezvous.close()  # a group of one needs no store
            return
        if backend == "nccl":
            # NVLink multicast (NVLS) can take a shared host's GPUs out of service: never use it.
            os.environ["NCCL_NVLS_ENABLE"] = "0"
            os.environ.update(nccl_socket_env(master_addr, os.environ))  # read when NCCL starts, below
            torch.cuda.set_device(self.device)
        serving = self.rank == 0
        if serving and rendezvous is None:
            rendezvous = Rendezvous(master_addr, master_port)
        self.rendezvous = rendezvous if serving else None
        # Not closed here should the store fail: its server owns the copy from uv_tcp_open on, and
        # closes it on the way out of any later failure (waiting for the other ranks, say).
        store = dist.TCPStore(
            master_addr,
            master_port,
            self.world_size,
            is_master=serving,
            timeout=timedelta(seconds=timeout_s),
            master_listen_fd=rendezvous.store_fd() if serving else None,
        )
        dist.init_process_group(
            backend=backend,
            store=store,
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=timeout_s),
        )

    def _collective_device(self) -> torch.device:
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")

    def _all_reduce_scalar(self, value: float | int, dtype: torch.dtype, op: str) -> float | int:
        # One-element collective; op names a dist.ReduceOp member, looked up only when a group exists.
        if not self.active:
            return value
        t = torch.tensor([value], dtype=dtype, device=self._collective_device())
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        return t.item()

    def all_reduce_sum(self, value: float) -> float:
        """The sum of ``value`` over the group (float64, so counts stay exact)."""
        return float(self._all_reduce_scalar(float(value), torch.float64, "SUM"))

    def reduce_max_int(self, value: int) -> int:
        """The largest ``value`` in the group."""
        return int(self._all_reduce_scalar(int(value), torch.long, "MAX"))

    def all_reduce_grads(self, model: torch.nn.Module) -> None:
        """Sum every parameter's gradient over the group, in one flat buffer (one collective)."""
        if not self.active:
            return
        params = [p for p in model.parameters() if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p, g in zip(params, grads, strict=True):
            n = g.numel()
            p.grad = flat[offset : offset + n].view_as(g).clone()
            offset += n

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def shutdown(self) -> None:
        """Leave the group: with several ranks, a barrier first, then the group, then rank 0's
        rendezvous socket. The barrier keeps any rank from tearing down its connections, and rank 0
        its store, while another still runs a collective; one that fails (a peer already gone) does
        not stop the teardown. Every rank must call this, as it must every collective.

        ``destroy_process_group`` drops torch.distributed's references to the group, not the group:
        once FSDP2 or DTensor has run, its DeviceMesh (kept by DTensor's sharding caches) holds it, so
        gloo's threads and rank 0's store server run on until the process ends. A process that exits
        through the interpreter (not killed, as Ray's workers are) should end with ``os._exit`` after
        this (tests/test_fsdp_gloo.py says why)."""
        if dist.is_initialized():
            if self.active:
                try:
                    if dist.get_backend() == "nccl" and self.device.index is not None:
                        dist.barrier(device_ids=[self.device.index])
                    else:
                        dist.barrier()
                except RuntimeError:  # a peer is gone (DistError is one): there is nothing left to wait for
                    pass
            dist.destroy_process_group()
        if self.rendezvous is not None:
            self.rendezvous.close()
            self.rendezvous = None
