"""Counted work: the ATen ops a call dispatched and the FLOPs they stand for, on any device, and on a
GPU the kernels, graph replays, copies, host syncs and collectives the call asked the GPU for.

A phase's time moves with the machine; the work it dispatches does not. ``count_work(fn)`` runs ``fn``
once under one dispatch mode, ``OpAndFlopCounter``: every ATen op that reached the dispatcher, whichever
device runs it, collectives included, and the FLOPs of the ops torch's ``FlopCounterMode`` has a
formula for (matmuls, convolutions, attention), by that mode's own handler. It sees what was
dispatched, not how fast a kernel ran: a slower kernel doing the same work counts the same.

In a process that has started CUDA, the call also runs under torch's profiler with CUDA activity, and
``device_counts`` files its events: the host's kernel launches (the CUDA runtime's and driver's launch
calls: ATen's kernels, cuBLAS's, Triton's), CUDA-graph launches (a replayed graph is one launch; its
kernels count under "kernels run"), the kernels the GPU ran (those inside replayed graphs too), the
host's memory copies, its blocking syncs (stream, event and device synchronisation) and the NCCL
collectives ProcessGroupNCCL ran. The dispatch modes cannot see any of these: a graph replay or a
Triton kernel is no ATen op. Bytes copied are not counted (the profiler's events do not carry them).

The driver counts its own process; each worker counts its share when the driver asks
(``trainer.driver.worker_group.WorkerGroup.counting``) and the shares are summed (``WorkCounts.__add__``).
Counting slows the call (a Python call per op), so a counted call is never a timed one.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any, TypeVar

import torch
from torch.autograd import DeviceType
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

# FlopCounterMode's handler as a dispatch mode of its own (recent torch): what OpAndFlopCounter extends.
# Where a torch has none, count_work stacks OpCounter over FlopCounterMode, which counts the same.
_FlopCounterMode: Any = getattr(torch.utils.flop_counter, "_FlopCounterMode", None)

T = TypeVar("T")


@dataclass(frozen=True)
class WorkCounts:
    """What one call dispatched: ATen ops and the FLOPs torch has formulas for; on a GPU (else 0) what
    it asked of the GPU (``device_counts``)."""

    ops: int = 0
    flops: int = 0
    launches: int = 0  # kernel launch calls on the host (a graph's kernels are not among them)
    graph_replays: int = 0  # CUDA-graph launches
    kernels: int = 0  # kernels the GPU ran, those of replayed graphs included
    copies: int = 0  # memory copies the host asked for (cudaMemcpy*)
    syncs: int = 0  # host waits on the GPU (stream, event or device synchronize)
    collectives: int = 0  # NCCL collectives (ProcessGroupNCCL's calls)

    def __add__(self, other: WorkCounts) -> WorkCounts:
        return WorkCounts(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    @property
    def on_device(self) -> bool:
        """Whether the GPU counters ran (a counted call on a GPU launches at least one kernel or graph)."""
        return bool(self.launches or self.graph_replays or self.kernels)


DEVICE_COUNTS = tuple(f.name for f in fields(WorkCounts) if f.name not in ("ops", "flops"))  # the GPU's fields


# The CUDA runtime and driver calls each device count is made of, as torch's profiler names them
LAUNCH_CALLS = frozenset({
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel", "cuLaunchKernel", "cuLaunchKernelEx",
})
GRAPH_LAUNCH_CALLS = frozenset({"cudaGraphLaunch", "cuGraphLaunch"})
SYNC_CALLS = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
})
COPY_PREFIXES = ("cudaMemcpy", "cuMemcpy")
COLLECTIVE_PREFIX = "nccl:"  # ProcessGroupNCCL's record_function names: "nccl:all_reduce", ...
DEVICE_NOT_KERNELS = ("Memcpy", "Memset")  # the GPU's copy and fill activities, not kernels


def device_counts(events: Iterable[tuple[str, bool, int]]) -> dict[str, int]:
    """The device counts of profiler events given as (name, ran on the GPU, how many times): the
    host's calls by name (LAUNCH_CALLS, GRAPH_LAUNCH_CALLS, SYNC_CALLS, COPY_PREFIXES,
    COLLECTIVE_PREFIX), the GPU's kernels (every GPU activity but copies and fills)."""
    out = dict.fromkeys(DEVICE_COUNTS, 0)
    for name, on_gpu, count in events:
        if on_gpu:
            if not name.startswith(DEVICE_NOT_KERNELS):
                out["kernels"] += count
        elif name in LAUNCH_CALLS:
            out["launches"] += count
        elif name in GRAPH_LAUNCH_CALLS:
            out["graph_replays"] += count
        elif name in SYNC_CALLS:
            out["syncs"] += count
        elif name.startswith(COPY_PREFIXES):
            out["copies"] += count
        elif name.startswith(COLLECTIVE_PREFIX):
            out["collectives"] += count
    return out


class OpCounter(TorchDispatchMode):
    """Counts every ATen op dispatched while active (one per call of an op overload)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.ops += 1
        return func(*args, **(kwargs or {}))


# The size queries FlopCounterMode's handler leaves to the tensor (NotImplemented): ops of tensors with
# their own sizes and strides (a nested tensor), never work
SIZE_QUERIES = frozenset(
    getattr(torch.ops.aten, name).default
    for name in ("sym_is_contiguous", "is_contiguous", "is_strides_like_format", "is_non_overlapping_and_dense",
                 "size", "sym_size", "stride", "sym_stride", "storage_offset", "sym_storage_offset", "numel",
                 "sym_numel", "dim")
    if hasattr(torch.ops.aten, name)
) | {torch.ops.aten.is_contiguous.memory_format, torch.ops.prim.layout.default}


class OpAndFlopCounter(_FlopCounterMode or TorchDispatchMode):
    """One dispatch mode that counts what ``OpCounter`` stacked over torch's ``FlopCounterMode`` counts:
    every ATen op as dispatched, and the FLOPs of FlopCounterMode's formulas, the same way (an op that
    has a CompositeImplicitAutograd decomposition is counted by its parts' FLOPs; size queries are left
    alone). About a third less Python per op than the two modes stacked, and no module tracking:
    FlopCounterMode's ModuleTracker hooks every module's forward and backward only to file FLOPs by
    module, which a total does not need (its hooks' own ``view_as`` of an input that requires grad
    counted as an op under the two modes: none of the trainer's phases has such an input). An op's
    decomposition counts as that op (as under the two modes, where OpCounter saw the op and
    FlopCounterMode its parts). Higher-order ops (compiled code), which the two modes stacked refused,
    take FlopCounterMode's own handler. Needs a torch that has ``_FlopCounterMode``."""

    def __init__(self, custom_mapping: dict[Any, Callable[..., int]]) -> None:
        # FlopCounterMode holds the formulas (its custom_mapping wrapped as it wraps them) and the FLOPs,
        # filed under "Global" (its ModuleTracker is never entered)
        super().__init__(FlopCounterMode(display=False, custom_mapping=custom_mapping))
        self.ops = 0
        self._depth = threading.local()  # decompositions in progress on this thread: their parts are no ops
        self._decomposable: dict[Any, bool] = {}  # by op overload (a registry lookup each is not free)

    def _decomposes(self, func: Any) -> bool:
        """Whether FlopCounterMode's handler would count ``func`` by its decomposition's parts."""
        known = self._decomposable.get(func)
        if known is None:
            known = self._decomposable[func] = func is not torch.ops.prim.device.default and func._can_decompose()
        return known

    @property
    def flops(self) -> int:
        return self.counter.get_total_flops()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        depth = getattr(self._depth, "value", 0)
        if not depth:
            self.ops += 1
        if func in SIZE_QUERIES:
            return NotImplemented
        if isinstance(func, torch._ops.HigherOrderOperator):
            return super().__torch_dispatch__(func, types, args, kwargs)
        if self._decomposes(func):
            self._depth.value = depth + 1
            try:
                with self:  # its parts come back through this mode and count their FLOPs
                    out = func.decompose(*args, **kwargs)
            finally:
                self._depth.value = depth
            if out is not NotImplemented:
                return out
        out = func(*args, **kwargs)
        return self.counter._count_flops(func._overloadpacket, out, args, kwargs)


# torch's attention FLOP formulas, by op: where each takes the query (the key and value follow it) and
# which dimension holds the heads (the scaled_dot_product ops: [b, h, s, d]; the flash and efficient
# kernels: [b, s, h, d], or [tokens, h, d] packed). Grouped-query attention gives key and value fewer
# heads, which torch before 2.12 refused to count.
ATTENTION_FLOP_OPS: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
                     "_scaled_dot_product_cudnn_attention"), (0, -3)),
    **dict.fromkeys(("_scaled_dot_product_efficient_attention_backward",
                     "_scaled_dot_product_flash_attention_backward",
                     "_scaled_dot_product_cudnn_attention_backward"), (1, -3)),
    **dict.fromkeys(("_flash_attention_forward", "_efficient_attention_forward"), (0, -2)),
    **dict.fromkeys(("_flash_attention_backward", "_efficient_attention_backward"), (1, -2)),
}


def heads_like_query(args: tuple, at: int, heads_dim: int) -> tuple:
    """``args`` with the key and value (after the query at ``at``) replaced by shape-only tensors with
    the query's heads (in dimension ``heads_dim``): a grouped-query attention's FLOPs are those of the
    same attention with each KV head repeated for its queries."""
    query = args[at]
    out = list(args)
    for i in (at + 1, at + 2):
        shape = list(args[i].shape)
        shape[heads_dim] = query.shape[heads_dim]
        out[i] = torch.empty(shape, dtype=args[i].dtype, device="meta")
    return tuple(out)


def grouped_query_tolerant(formula: Callable[..., int], at: int, heads_dim: int) -> Callable[..., int]:
    """torch's attention FLOP formula ``formula`` (it takes the op's own arguments), counting a
    grouped-query call as its repeated-heads equal where this torch's formula refuses it."""

    def count(*args: Any, **kwargs: Any) -> int:
        try:
            return formula(*args, **kwargs)
        except AssertionError:  # torch < 2.12: "query/key/value shapes are incompatible"
            return formula(*heads_like_query(args, at, heads_dim), **kwargs)

    count._get_raw = True  # type: ignore[attr-defined]  # FlopCounterMode hands it the op's arguments as they are
    return count


def attention_flop_formulas() -> dict[Any, Callable[..., int]]:
    """FlopCounterMode's custom_mapping: each attention op this torch has a formula for, tolerant of
    grouped-query attention (as torch's own formulas are from 2.12 on: the same counts)."""
    from torch.utils.flop_counter import flop_registry

    out = {}
    for name, (at, heads_dim) in ATTENTION_FLOP_OPS.items():
        op = getattr(torch.ops.aten, name, None)
        if op is not None and op in flop_registry:
            out[op] = grouped_query_tolerant(flop_registry[op], at, heads_dim)
    return out


@contextlib.contextmanager
def one_mode_counters() -> Iterator[Callable[[], tuple[int, int]]]:
    """Counts ops and FLOPs in one dispatch mode (``OpAndFlopCounter``); yields how to read (ops, FLOPs)."""
    counter = OpAndFlopCounter(attention_flop_formulas())
    with counter:
        yield lambda: (counter.ops, int(counter.flops))


@contextlib.contextmanager
def stacked_counters() -> Iterator[Callable[[], tuple[int, int]]]:
    """Counts ops and FLOPs as count_work did before ``OpAndFlopCounter`` (and still does on a torch
    without ``_FlopCounterMode``): ``OpCounter`` over torch's ``FlopCounterMode``, its module tracking on."""
    flops = FlopCounterMode(display=False, custom_mapping=attention_flop_formulas())
    ops = OpCounter()
    with flops, ops:  # the op counter innermost: it sees each op as dispatched
        yield lambda: (ops.ops, int(flops.get_total_flops()))


def count_work(
    fn: Callable[[], T],
    counters: Callable[[], contextlib.AbstractContextManager] | None = None,
    device: bool = True,
) -> tuple[T, WorkCounts]:
    """``fn()``'s result and the work it dispatched in this process (on a GPU, what it asked of the GPU
    too), counted by ``counters`` (default: ``one_mode_counters`` where this torch has its FLOP mode).

    device=False: the host's dispatch alone, for a process whose workers run the GPU work (the
    trainer's driver): its own CUDA, where something started it, runs none of it, and torch's profiler
    would only cost time and warn."""
    counters = counters or (one_mode_counters if _FlopCounterMode is not None else stacked_counters)
    profiler = _device_profiler() if device else None
    with profiler or contextlib.nullcontext():
        with counters() as read:
            result = fn()
        if profiler is not None:
            # the GPU's activities of this call end inside the profile; this sync, and the one the
            # profiler makes as it stops, come after the marker and are not counted (fn's are)
            with torch.profiler.record_function(COUNTING_ENDS):
                torch.cuda.synchronize()
    device = device_counts(profiled_events(profiler)) if profiler is not None else {}
    ops, flops = read()
    return result, WorkCounts(ops, flops, **device)


COUNTING_ENDS = "rlbench::counting_ends"  # count_work's marker: the host's calls from it on are the counter's own


def profiled_events(profiler: Any) -> Iterable[tuple[str, bool, int]]:
    """(name, ran on the GPU, 1) for every event a finished profiler kept, read from its raw results:
    ``key_averages()`` first builds torch's FunctionEvent tree in Python, which for a counted step16x8
    phase (hundreds of thousands of kernels in replayed graphs) took longer than the phase's own rounds.
    Hidden events are left out, as ``key_averages`` leaves them, and so are the host's calls from
    count_work's COUNTING_ENDS marker on (its closing syncs; the GPU's activities are all kept, since
    the GPU may still run fn's work then). Where the raw results are not there (another torch),
    ``key_averages`` it is, closing syncs included."""
    results = getattr(getattr(profiler, "profiler", None), "kineto_results", None)
    if results is None:
        return ((e.key, e.device_type == DeviceType.CUDA, e.count) for e in profiler.key_averages())
    events = [e for e in results.events() if not getattr(e, "is_hidden_event", lambda: False)()]
    ends = min((e.start_ns() for e in events if e.name() == COUNTING_ENDS), default=None)
    return (
        (e.name(), on_gpu, 1)
        for e in events
        if e.name() != COUNTING_ENDS
        and ((on_gpu := e.device_type() == DeviceType.CUDA) or ends is None or e.start_ns() < ends)
    )


def _device_profiler() -> Any:
    """torch's profiler with CUDA activity where this process has started CUDA, else None (a CPU worker,
    or a driver that leaves the GPU to its workers: nothing to count, and the profiler is not free)."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
