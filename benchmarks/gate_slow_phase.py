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


def burn_gpu(worker: Any, seconds: float) -> float:
    """Runs in a worker: bf16 matmuls on its GPU until ``seconds`` have passed; the seconds spent."""
    import torch

    operand = getattr(worker, "_gate_burn_operand", None)
    if operand is None:
        operand = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        worker._gate_burn_operand = operand
    torch.cuda.synchronize()
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(2):  # ~0.2 ms each on an H100: the added time overshoots by under 1 ms
            operand @ operand
        torch.cuda.synchronize()
    return time.perf_counter() - start


def burn_cpu(seconds: float) -> float:
    """In this process: fp32 matmuls on one thread until ``seconds`` have passed; the seconds spent.
    One thread: each worker adds its share on its own core, as it runs the phase's own work."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        operand = torch.ones(192, 192)  # ~0.5 ms a product on one core: the added time overshoots by under 1 ms
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            operand @ operand
        return time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)


def burn_worker_cpu(worker: Any, seconds: float, count: bool) -> Any:
    """Runs in a worker: ``burn_cpu``; with ``count``, the work it dispatched (a WorkCounts), as the
    worker's share of a counted round."""
    if not count:
        burn_cpu(seconds)
        return None
    from trainer.work_counts import count_work

    return count_work(lambda: burn_cpu(seconds))[1]


def burn_on_workers(group: Any, seconds: float, on_gpu: bool) -> None:
    """``seconds`` of real work on every worker of the trainer's WorkerGroup: on its GPU, or on its CPU
    (counted with the phase where the group counts a round's work)."""
    import ray

    if on_gpu:
        ray.get([w.__ray_call__.remote(burn_gpu, seconds) for w in group.workers])
        return
    counting = group.counted is not None
    shares = ray.get([w.__ray_call__.remote(burn_worker_cpu, seconds, counting) for w in group.workers])
    if counting:
        group.counted.extend(shares)


def slowed(method: Callable[..., Any], fraction: float, on_gpu: bool, cpu_work: bool = False) -> Callable[..., Any]:
    """``method``, followed by ``fraction`` of the time the call took: asleep, or busy on the workers'
    GPUs (``on_gpu``) or CPUs (``cpu_work``)."""

    overhead = [0.0]  # on CPU workers: what the last burn cost beyond its own seconds (the remote calls)

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = method(self, *args, **kwargs)
        extra = fraction * (time.perf_counter() - start)
        if on_gpu:
            burn_on_workers(self.workers, extra, on_gpu)
        elif cpu_work:
            # A remote call to each worker costs milliseconds on a 2-core VM, a large part of 10% of a
            # 0.13 s phase: burn for less by what the last call cost beyond its burn.
            burn = max(extra - overhead[0], 0.0)
            begin = time.perf_counter()
            burn_on_workers(self.workers, burn, on_gpu)
            overhead[0] = max(time.perf_counter() - begin - burn, 0.0)
        else:
            time.sleep(extra)
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
