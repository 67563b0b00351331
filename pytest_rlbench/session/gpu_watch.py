"""What the session's GPUs did during each timed round, read through NVML (``nvidia-ml-py``).

A ``GpuWatch`` samples the GPUs the workers run on (matched by UUID, on the driver's node: NVML sees
only local GPUs) every ``interval_s`` from a thread, and ``mark_start``/``mark_end`` bound each round.
Per round it keeps what decides whether a slower phase is the code or the GPU
(``pytest_rlbench.verdict.machine_load`` judges it): the median SM and memory clocks, the mean power
and its cap, the hottest temperature, the throttle reasons seen, and processes of other sessions on
the GPUs. Without NVML (no GPU, no driver, or ``nvidia-ml-py`` not installed) nothing is recorded and
the verdicts say so.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from pytest_rlbench.verdict.machine_load import (
    GPU_UNITS,
    RoundTelemetry,
    gpu_metric,
    per_round_figures,
    throttle_names,
)


def _nvml() -> Any | None:
    """pynvml, initialised; None where NVML cannot run here."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound / DriverNotLoaded: a machine without a GPU driver
        return None
    return pynvml


def machine_label(uuids: list[str]) -> str | None:
    """Which GPUs a run used, in a few characters: "gpus <8 hex of a hash of their UUIDs>, driver
    <version>" (the driver read through NVML where it can be); None without GPUs."""
    if not uuids:
        return None
    digest = hashlib.sha256(",".join(sorted(nvml_uuid(u) for u in uuids)).encode()).hexdigest()[:8]
    nvml = _nvml()
    driver = None
    if nvml is not None:
        try:
            driver = nvml.nvmlSystemGetDriverVersion()
        except Exception:
            driver = None
        finally:
            nvml.nvmlShutdown()
    return f"gpus {digest}, driver {driver}" if driver else f"gpus {digest}"


def nvml_uuid(torch_uuid: str) -> str:
    """NVML's spelling of a GPU UUID ("GPU-<hex>"); torch writes the bare hex."""
    return torch_uuid if torch_uuid.startswith(("GPU-", "MIG-")) else f"GPU-{torch_uuid}"


@dataclass
class _Sample:
    t: float
    sm_mhz: list[float]
    mem_mhz: list[float]
    power_w: list[float]
    temp_c: list[float]
    reasons: int  # OR of every GPU's throttle reasons


@dataclass
class GpuWatch:
    """Samples the GPUs named by ``uuids`` between ``start()`` and ``stop()``; ``rounds()`` gives one
    ``RoundTelemetry`` per round marked with ``mark_start``/``mark_end``."""

    uuids: list[str]
    session_pids: set[int] = field(default_factory=set)  # the session's own processes on the GPUs
    interval_s: float = 0.02
    _nvml: Any = None
    _handles: list[Any] = field(default_factory=list)
    _samples: list[_Sample] = field(default_factory=list)
    _marks: list[tuple[float, float | None]] = field(default_factory=list)
    _others: list[set[int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _cap_w: float | None = None

    @property
    def available(self) -> bool:
        return bool(self._handles)

    def start(self) -> None:
        self._nvml = _nvml()
        if self._nvml is None:
            return
        for uuid in self.uuids:
            try:
                self._handles.append(self._nvml.nvmlDeviceGetHandleByUUID(nvml_uuid(uuid)))
            except Exception:  # a GPU of another node: NVML sees only this one's
                continue
        if not self._handles:
            return
        try:
            self._cap_w = min(self._nvml.nvmlDeviceGetEnforcedPowerLimit(h) for h in self._handles) / 1000
        except Exception:
            self._cap_w = None
        self._thread = threading.Thread(target=self._run, name="rlbench-gpu-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass

    def mark_start(self) -> None:
        if self.available:
            self._marks.append((time.monotonic(), None))
            self._others.append(self._other_processes())

    def mark_end(self) -> None:
        if self.available and self._marks and self._marks[-1][1] is None:
            self._marks[-1] = (self._marks[-1][0], time.monotonic())

    def _read(self) -> _Sample:
        nv = self._nvml
        reasons_of = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        sm, mem, power, temp, reasons = [], [], [], [], 0
        for h in self._handles:
            sm.append(float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)))
            mem.append(float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)))
            power.append(nv.nvmlDeviceGetPowerUsage(h) / 1000)
            temp.append(float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)))
            reasons |= int(reasons_of(h))
        return _Sample(time.monotonic(), sm, mem, power, temp, reasons)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._samples.append(self._read())
            except Exception:  # a GPU gone mid-session: keep what was read
                return
            self._stop.wait(self.interval_s)

    def _other_processes(self) -> set[int]:
        """PIDs of compute processes on the session's GPUs that are not the session's own."""
        pids: set[int] = set()
        for h in self._handles:
            try:
                procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(h)
            except Exception:
                continue
            pids |= {int(p.pid) for p in procs}
        own = self.session_pids | {os.getpid()}
        return {p for p in pids if p not in own}

    def metrics(self, phase: str, warmup: int) -> list[tuple[str, list[float], str]]:
        """(metric id, one value per timed round, unit) of each figure (a round watch,
        ``pytest_rlbench.session.bench.RoundWatch``)."""
        figures = per_round_figures(self.rounds(skip=warmup))
        return [(gpu_metric(figure, phase), values, GPU_UNITS.get(figure, "")) for figure, values in figures.items()]

    def rounds(self, skip: int = 0) -> list[RoundTelemetry]:
        """One summary per marked round, the first ``skip`` (warm-up) rounds left out; a round
        with no sample (shorter than the interval) reads the sample nearest its end."""
        out: list[RoundTelemetry] = []
        samples = list(self._samples)
        for (begin, end), others in list(zip(self._marks, self._others, strict=True))[skip:]:
            if end is None or not samples:
                continue
            inside = [s for s in samples if begin <= s.t <= end] or [
                min(samples, key=lambda s: abs(s.t - end))
            ]
            reasons = 0
            for s in inside:
                reasons |= s.reasons
            out.append(
                RoundTelemetry(
                    sm_clock_mhz=statistics.median(min(s.sm_mhz) for s in inside),
                    mem_clock_mhz=statistics.median(min(s.mem_mhz) for s in inside),
                    power_w=statistics.fmean(sum(s.power_w) / len(s.power_w) for s in inside),
                    power_cap_w=self._cap_w,
                    temperature_c=max(max(s.temp_c) for s in inside),
                    throttle=throttle_names(reasons),
                    other_processes=len(others),
                )
            )
        return out
