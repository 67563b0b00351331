"""How much a figure may move before a gate calls it worse: the default tolerances and the noise floors.

A tolerance is a fraction of the baseline's value; a noise floor is an absolute difference below which
no ratio counts (a phase's seconds, or a fidelity figure's own unit). Where each figure comes from is
docs/benchmarks.md ("The gate's error rates"); a verdict names the tolerance and floor it applied.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_rlbench.records.metrics import PANEL, ROLLOUT_FIDELITY, family_of

# Allowed fraction of slowdown against a baseline when neither the option nor the baseline says.
DEFAULT_TOLERANCE = 0.10
# The default on CPU workers: the host's drift is taken out by the session's pace and re-timing, not by
# a wider tolerance (docs/benchmarks.md, "Where the gate's constants come from").
DEFAULT_CPU_TOLERANCE = 0.15


class DefaultTolerance(float):
    """A tolerance nobody chose (neither --rl-tolerance, the ini file nor the baseline file gives one),
    so that a verdict's text can say it applied the default. A chosen tolerance is a plain float and
    always wins."""

    __slots__ = ()


def default_tolerance(gpu: bool) -> float:
    """The tolerance when neither --rl-tolerance nor the baseline file gives one."""
    if gpu:
        return DEFAULT_TOLERANCE
    return DefaultTolerance(DEFAULT_CPU_TOLERANCE)


@dataclass(frozen=True)
class NoiseFloor:
    """The smallest change in a phase's time a gate can tell from noise, per device kind. A figure
    derived from the time (tokens/s, ms per token, MFU, bandwidth use) gets its time's floor: a
    difference whose equivalent in seconds is below it is not a regression, whatever its ratio."""

    cpu_s: float
    gpu_s: float

    def for_device(self, device: str) -> float:
        return self.gpu_s if device == "gpu" else self.cpu_s


# A phase's time is read through Ray (a remote call and a device drain per round), which moves a round
# of a few milliseconds by whole milliseconds (docs/benchmarks.md, "Where the gate's constants come from").
PHASE_TIME_FLOOR = NoiseFloor(cpu_s=0.010, gpu_s=0.001)
# Phases that wait on the filesystem (a checkpoint's writes and renames) move by more.
PHASE_FLOORS: dict[str, NoiseFloor] = {"save_checkpoint": NoiseFloor(cpu_s=0.050, gpu_s=0.050)}


def phase_floor(phase: str, device: str) -> float:
    """The smallest change in ``phase``'s time (seconds) a gate tells from noise on ``device``
    ("gpu" or "cpu"); every built-in figure family is timed by a phase and shares it."""
    return PHASE_FLOORS.get(phase, PHASE_TIME_FLOOR).for_device(device)


# The smallest change in a fidelity figure a gate can tell from arithmetic noise, in the figure's own
# unit, keyed by the figure's last name part (rollout_panel/<engine>/<figure> shares it) (docs/benchmarks.md, "Where the gate's constants come from").
FIDELITY_FLOORS: dict[str, float] = {
    "token_mult_prob_error": 0.005,
    "probs_diff_max": 0.01,
    "probs_diff_mean": 0.002,
    "probs_diff_std": 0.002,
    "pearson": 0.001,
    "mismatch_kl": 0.001,
}


def value_floor(metric: str) -> float | None:
    """The absolute noise floor of a fidelity figure (rollout_fidelity/* or rollout_panel/*/*), else None."""
    if family_of(metric) not in (ROLLOUT_FIDELITY, PANEL):
        return None
    return FIDELITY_FLOORS.get(metric.rpartition("/")[2])
