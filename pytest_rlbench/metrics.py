"""The metric families: one table of what each kind of figure is, read by derive, compare and the reports.

A metric id is "family/phase" (e.g. "timing_s/gen"); a record's custom metrics have ids of their own.
A baseline's tolerances may name a whole family. The families and their token counting follow VERL's
logged metrics (verl/trainer/ppo/metric_utils.py: compute_timing_metrics, compute_throughout_metrics;
tokens_per_s_per_gpu/step is VERL's perf/throughput, mfu/* its perf/mfu).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.phases import PHASE_KEYS

# Allowed fraction of slowdown against a baseline when neither the option nor the baseline says.
DEFAULT_TOLERANCE = 0.10
# The default on CPU workers. The host's drift (1.2-1.65x between whole sessions on a 2-core VM, and
# seconds-long slowdowns of one phase's rounds) is taken out by the session's pace and by re-timing a
# failed phase (pytest_rlbench.session_pace, pytest_rlbench.retiming), not by a wider tolerance: at
# 0.20 those kept all 20 same-code runs from failing but let 2 of 20 slowdowns of 25% through, whose
# ratio then sat within the noise of the 0.20 line (docs/benchmarks.md, "The gate's error rates").
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


TIMING = "timing_s"
# A phase's rounds timed again at the end of the session when its gate failed on CPU workers
# ("retimed_s/<phase>"): evidence for that verdict (pytest_rlbench.verdict), never judged on its own.
RETIMED = "retimed_s"
TIMING_PER_TOKEN = "timing_per_token_ms"
THROUGHPUT = "tokens_per_s_per_gpu"
MFU = "mfu"
BANDWIDTH = "bandwidth_util"

# Which tokens a phase's figures count: VERL's compute_timing_metrics counts response tokens for gen
# and prompt + response tokens for the others (old_log_prob and step counted the same way here).
RESPONSE = "response"
PROMPT_AND_RESPONSE = "prompt+response"
TOKEN_BASIS: dict[str, str] = {
    "gen": RESPONSE,
    "old_log_prob": PROMPT_AND_RESPONSE,
    "ref": PROMPT_AND_RESPONSE,
    "adv": PROMPT_AND_RESPONSE,
    "update_actor": PROMPT_AND_RESPONSE,
    "step": PROMPT_AND_RESPONSE,
}


@dataclass(frozen=True)
class NoiseFloor:
    """The smallest change in a phase's time a gate can tell from noise, per device kind. A figure
    derived from the time (tokens/s, ms per token, MFU, bandwidth use) gets its time's floor: a
    difference whose equivalent in seconds is below it is not a regression, whatever its ratio."""

    cpu_s: float
    gpu_s: float

    def for_device(self, device: str) -> float:
        return self.gpu_s if device == "gpu" else self.cpu_s


# A phase's time is read through Ray (a remote call and a device drain per round). On a CPU worker a
# round of a few milliseconds moves by whole milliseconds with the scheduler (measured on a 2-core
# machine: reshard ~1 ms and adv ~0.1 ms varied by 25%); on a GPU the remote call's jitter dominates.
PHASE_TIME_FLOOR = NoiseFloor(cpu_s=0.010, gpu_s=0.001)
# Phases that wait on the filesystem (a checkpoint's writes and renames) move by more: 29-41 ms for
# the same save on the CPU machine above.
PHASE_FLOORS: dict[str, NoiseFloor] = {"save_checkpoint": NoiseFloor(cpu_s=0.050, gpu_s=0.050)}


def phase_floor(phase: str, device: str) -> float:
    """The smallest change in ``phase``'s time (seconds) a gate tells from noise on ``device``
    ("gpu" or "cpu"); every built-in figure family is timed by a phase and shares it."""
    return PHASE_FLOORS.get(phase, PHASE_TIME_FLOOR).for_device(device)


@dataclass(frozen=True)
class MetricFamily:
    """What a family's figures are and how a reference lists them (which families a gate judges, and
    which it lists beside, is per kind of gate: ``gate_basis.BASIS_FAMILIES``)."""

    name: str
    unit: str  # "fraction" values print as percentages
    higher_is_better: bool
    label: str  # the reports' column name: "gen seconds", "gen tokens/s per GPU"
    phases: tuple[str, ...]  # the phases that have this figure when timed
    counts_tokens: bool  # divides by (or into) the tokens of TOKEN_BASIS[phase]
    in_reference: bool  # listed side by side when run and baseline did not do the same work alike


FAMILIES: dict[str, MetricFamily] = {
    f.name: f
    for f in (
        MetricFamily(
            TIMING, "s", higher_is_better=False, label="seconds", phases=PHASE_KEYS,
            counts_tokens=False, in_reference=True,
        ),
        MetricFamily(
            TIMING_PER_TOKEN, "ms/token", higher_is_better=False, label="ms per token",
            phases=("gen", "old_log_prob", "ref", "adv", "update_actor"),
            counts_tokens=True, in_reference=False,
        ),
        MetricFamily(
            THROUGHPUT, "tokens/s/GPU", higher_is_better=True, label="tokens/s per GPU",
            phases=("gen", "old_log_prob", "ref", "update_actor", "step"),
            counts_tokens=True, in_reference=True,
        ),
        MetricFamily(
            MFU, "fraction", higher_is_better=True, label="MFU", phases=("old_log_prob", "ref", "update_actor"),
            counts_tokens=False, in_reference=True,
        ),
        MetricFamily(
            BANDWIDTH, "fraction", higher_is_better=True, label="bandwidth use", phases=("gen",),
            counts_tokens=False, in_reference=True,
        ),
    )
}
# Figures a training step reports of itself (StepResult.metrics), recorded as the run's metrics and
# compared with a baseline's like throughputs: metric id -> (unit, higher is better). Not in FAMILIES,
# whose names record.py reserves for figures derived from phase timings; and one family here holds
# figures of both directions. The rollout_fidelity/* figures: trainer/algorithms/fidelity.py.
ROLLOUT_FIDELITY = "rollout_fidelity"
STEP_METRICS: dict[str, tuple[str, bool]] = {
    f"{ROLLOUT_FIDELITY}/token_mult_prob_error": ("x", False),
    f"{ROLLOUT_FIDELITY}/probs_diff_max": ("", False),
    f"{ROLLOUT_FIDELITY}/probs_diff_mean": ("", False),
    f"{ROLLOUT_FIDELITY}/probs_diff_std": ("", False),
    f"{ROLLOUT_FIDELITY}/pearson": ("", True),
    f"{ROLLOUT_FIDELITY}/mismatch_kl": ("nats", False),
}
# The smallest change in a fidelity figure a gate can tell from arithmetic noise, in the figure's
# own unit (keyed by the figure's last name part, so rollout_panel/<engine>/<figure> shares it). On a
# CPU in fp32 these figures are rounding noise (mismatch_kl ~1e-14) whose ranks are random; on a GPU
# in bf16, same-code runs move token_mult_prob_error by about 1e-3 (docs/benchmarks.md).
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
    if family_of(metric) not in (ROLLOUT_FIDELITY, "rollout_panel"):
        return None
    return FIDELITY_FLOORS.get(metric.rpartition("/")[2])


METRIC_FAMILIES: tuple[str, ...] = tuple(FAMILIES)
REFERENCE_FAMILIES: tuple[str, ...] = tuple(name for name, f in FAMILIES.items() if f.in_reference)
# Figures that carry across hardware: a reference lists the run's even where the baseline has none.
EFFICIENCY_FAMILIES: tuple[str, ...] = (MFU, BANDWIDTH)


def family_of(metric: str) -> str:
    """The family part of a metric id ("timing_s/gen" -> "timing_s"); a custom metric's whole name."""
    return metric.partition("/")[0]


def family_label(metric: str) -> str:
    """A metric's column name without its phase ("seconds"); a custom metric's own name."""
    family = family_of(metric)
    return FAMILIES[family].label if family in FAMILIES else metric


def metric_label(metric: str) -> str:
    """How the reports name a metric: "gen seconds" for "timing_s/gen", a custom metric as it is."""
    family, _, phase = metric.partition("/")
    return f"{phase} {FAMILIES[family].label}" if family in FAMILIES else metric


def _number(value: float) -> str:
    size = abs(value)
    if size >= 1000:
        return f"{value:,.0f}"
    if size >= 1 or value == 0:
        return f"{value:.2f}"
    return f"{value:.3f}" if size >= 0.01 else f"{value:.3g}"


def format_value(value: float | None, unit: str) -> str:
    """A value with its unit, as the reports print it ("1.32 s", "41.2%")."""
    if value is None:
        return "-"
    if unit == "fraction":
        return f"{value:.1%}"
    return f"{_number(value)} {unit}".rstrip()
