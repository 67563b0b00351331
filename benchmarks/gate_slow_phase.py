"""Test-only pytest plugin: trainer phases made deliberately slower, to measure whether the gate
catches it (``benchmarks/gate_error_rates.py``, ``benchmarks/gpu_suites.sh gate16x8``). Never loaded
unless named: ``-p gate_slow_phase`` with ``benchmarks/`` on ``PYTHONPATH``.

The phase methods ``GATE_SLOW_METHOD`` of ``GRPOTrainer`` (comma-separated; default
``compute_old_log_prob``) are wrapped at configure time: each call runs the real method, then adds
``GATE_SLOWDOWN`` (default 0.25) times the duration that call took, so the phase becomes that fraction
slower wherever it is called from (its own benchmark and the whole step's). The added time is a sleep
on the driver, or with ``GATE_SLOW_GPU=1`` real GPU work on every worker (bf16 matmuls on its GPU for
that long, run inside the worker process through Ray's ``__ray_call__``): a regression that draws
power and holds the GPU as a slower kernel would. With ``GATE_SLOW_CPU_WORK=1`` it is real CPU work
on every worker instead (fp32 matmuls on one thread for that long, the same way): a regression of
more work, which the counted work (``trainer/work_counts.py``) sees as it would see a phase that
computes something twice (in a counted round the workers count the added matmuls and hand them to
the trainer's count), where a sleep in the driver adds time and no work. The class attributes are
restored at unconfigure.

A counted round (``trainer/work_counts.py``: slower by its counters) adds the work of the last timed
call, not a fraction of its own longer time: the burn's products, GPU or CPU, are counted exactly as
many as a timed round ran, so the counts show the regression at the size the times do.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

METHOD_ENV = "GATE_SLOW_METHOD"
FRACTION_ENV = "GATE_SLOWDOWN"
GPU_ENV = "GATE_SLOW_GPU"
CPU_WORK_ENV = "GATE_SLOW_CPU_WORK"
DEFAULT_METHOD = "compute_old_log_prob"
DEFAULT_FRACTION = 0.25
ORIGINAL_KEY = pytest.StashKey[list[tuple[str, Callable[..., Any]]]]()


def burning(start: float, done: int, seconds: float, products: int | None) -> bool:
    """Whether a burn goes on: until ``seconds`` have passed since ``start``, or ``products`` are done."""
    return done < products if products is not None else time.perf_counter() - start < seconds


def counted_share(burn: Callable[[], int], count: bool) -> tuple[int, Any]:
    """Runs in a worker: ``burn()`` and, with ``count``, the work it dispatched (a WorkCounts, the
    worker's share of a counted round; else None)."""
    if not count:
        return burn(), None
    from trainer.work_counts import count_work

    return count_work(burn)


def burn_gpu(worker: Any, seconds: float, products: int | None = None) -> int:
    """Runs in a worker: bf16 matmuls on its GPU until ``seconds`` have passed, or exactly ``products``
    of them where given; how many it ran."""
    import torch

    operand = getattr(worker, "_gate_burn_operand", None)
    if operand is None:
        operand = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        worker._gate_burn_operand = operand
    torch.cuda.synchronize()
    start, done = time.perf_counter(), 0
    while burning(start, done, seconds, products):
        for _ in range(2):  # ~0.2 ms each on an H100: the added time overshoots by under 1 ms
            operand @ operand
        done += 2
        torch.cuda.synchronize()
    return done


def burn_worker_gpu(worker: Any, seconds: float, products: int | None, count: bool) -> tuple[int, Any]:
    """Runs in a worker: ``burn_gpu``, counted where ``count`` (``counted_share``)."""
    return counted_share(lambda: burn_gpu(worker, seconds, products), count)


def burn_cpu(seconds: float, products: int | None = None) -> int:
    """In this process: fp32 matmuls on one thread until ``seconds`` have passed, or exactly ``products``
    of them where given; how many it ran. One thread: each worker adds its share on its own core, as it
    runs the phase's own work."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        operand = torch.ones(192, 192)  # ~0.5 ms a product on one core: the added time overshoots by under 1 ms
        start, done = time.perf_counter(), 0
        while burning(start, done, seconds, products):
            operand @ operand
            done += 1
        return done
    finally:
        torch.set_num_threads(threads)


def burn_worker_cpu(worker: Any, seconds: float, products: int | None, count: bool) -> tuple[int, Any]:
    """Runs in a worker: ``burn_cpu``, counted where ``count`` (``counted_share``)."""
    return counted_share(lambda: burn_cpu(seconds, products), count)


def burn_on_workers(group: Any, seconds: float, on_gpu: bool, products: list[int] | None = None) -> list[int]:
    """``seconds`` of real work on every worker of the trainer's WorkerGroup, on its GPU or on its CPU,
    or each worker's ``products`` where given (a counted round: the last timed call's work, counted with
    the phase); how many products each worker ran."""
    import ray

    counting = group.counted is not None
    burn = burn_worker_gpu if on_gpu else burn_worker_cpu
    each = products or [None] * len(group.workers)
    done = ray.get([w.__ray_call__.remote(burn, seconds, n, counting) for w, n in zip(group.workers, each, strict=True)])
    if counting:
        group.counted.extend(work for _, work in done)
    return [n for n, _ in done]


def slowed(method: Callable[..., Any], fraction: float, on_gpu: bool, cpu_work: bool = False) -> Callable[..., Any]:
    """``method``, followed by ``fraction`` of the time the call took: asleep, or busy on the workers'
    GPUs (``on_gpu``) or CPUs (``cpu_work``); in a counted round, the last timed call's products again."""

    overhead = 0.0  # on CPU workers: what the last burn cost beyond its own seconds (the remote calls)
    last: list[int] | None = None  # each worker's products in the last timed call

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal overhead, last
        start = time.perf_counter()
        result = method(self, *args, **kwargs)
        extra = fraction * (time.perf_counter() - start)
        if not (on_gpu or cpu_work):
            time.sleep(extra)
            return result
        if self.workers.counted is not None:  # a counted round: the timed call's work, not its own time's
            burn_on_workers(self.workers, extra, on_gpu, last)
            return result
        # A remote call to each worker costs milliseconds on a 2-core VM, a large part of 10% of a 0.13 s
        # phase: on CPU workers burn for less by what the last call cost beyond its burn.
        burn = extra if on_gpu else max(extra - overhead, 0.0)
        begin = time.perf_counter()
        last = burn_on_workers(self.workers, burn, on_gpu)
        overhead = max(time.perf_counter() - begin - burn, 0.0)
        return result

    return wrapper


def pytest_configure(config: pytest.Config) -> None:
    from trainer.driver.grpo_trainer import GRPOTrainer

    names = [n.strip() for n in os.environ.get(METHOD_ENV, DEFAULT_METHOD).split(",") if n.strip()]
    fraction = float(os.environ.get(FRACTION_ENV, DEFAULT_FRACTION))
    on_gpu = os.environ.get(GPU_ENV, "") == "1"
    cpu_work = os.environ.get(CPU_WORK_ENV, "") == "1"
    if not 0 < fraction < 10:
        raise pytest.UsageError(f"{FRACTION_ENV}={fraction!r}: expected a fraction of the phase's time in (0, 10)")
    saved = []
    for name in names:
        method = getattr(GRPOTrainer, name, None)
        if not callable(method):
            raise pytest.UsageError(f"{METHOD_ENV}={name!r}: GRPOTrainer has no such method")
        saved.append((name, method))
    if on_gpu or cpu_work:  # the workers cannot import this module: ship the burn by value
        import ray.cloudpickle

        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    config.stash[ORIGINAL_KEY] = saved
    for name, method in saved:
        setattr(GRPOTrainer, name, slowed(method, fraction, on_gpu, cpu_work))


def pytest_unconfigure(config: pytest.Config) -> None:
    from trainer.driver.grpo_trainer import GRPOTrainer

    for name, method in config.stash.get(ORIGINAL_KEY, []):
        setattr(GRPOTrainer, name, method)
