"""Test-only pytest plugin: one trainer phase made deliberately slower, to measure whether the gate
catches it (``benchmarks/gate_error_rates.py``). Never loaded unless named: ``-p gate_slow_phase``
with ``benchmarks/`` on ``PYTHONPATH``.

The phase method ``GATE_SLOW_METHOD`` of ``GRPOTrainer`` (default ``compute_old_log_prob``) is
wrapped at configure time: each call runs the real method, then sleeps ``GATE_SLOWDOWN`` (default
0.25) times the duration that call took, so the phase becomes that fraction slower wherever it is
called from (its own benchmark and the whole step's). The class attribute is restored at unconfigure.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any

import pytest

METHOD_ENV = "GATE_SLOW_METHOD"
FRACTION_ENV = "GATE_SLOWDOWN"
DEFAULT_METHOD = "compute_old_log_prob"
DEFAULT_FRACTION = 0.25
ORIGINAL_KEY = pytest.StashKey[tuple[str, Callable[..., Any]]]()


def slowed(method: Callable[..., Any], fraction: float) -> Callable[..., Any]:
    """``method``, followed by a sleep of ``fraction`` of the time the call took."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = method(*args, **kwargs)
        time.sleep(fraction * (time.perf_counter() - start))
        return result

    return wrapper


def pytest_configure(config: pytest.Config) -> None:
    from trainer.driver.grpo_trainer import GRPOTrainer

    name = os.environ.get(METHOD_ENV, DEFAULT_METHOD)
    fraction = float(os.environ.get(FRACTION_ENV, DEFAULT_FRACTION))
    method = getattr(GRPOTrainer, name, None)
    if not callable(method):
        raise pytest.UsageError(f"{METHOD_ENV}={name!r}: GRPOTrainer has no such method")
    if not 0 < fraction < 10:
        raise pytest.UsageError(f"{FRACTION_ENV}={fraction!r}: expected a fraction of the phase's time in (0, 10)")
    config.stash[ORIGINAL_KEY] = (name, method)
    setattr(GRPOTrainer, name, slowed(method, fraction))


def pytest_unconfigure(config: pytest.Config) -> None:
    from trainer.driver.grpo_trainer import GRPOTrainer

    saved = config.stash.get(ORIGINAL_KEY, None)
    if saved is not None:
        setattr(GRPOTrainer, saved[0], saved[1])
