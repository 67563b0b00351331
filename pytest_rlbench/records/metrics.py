"""The metric families: one table of what each kind of figure is, read by derive, compare and the reports.

A metric id is "family/phase" (e.g. "timing_s/gen"); a record's custom metrics have ids of their own.
A baseline's tolerances may name a whole family. The families and their token counting follow VERL's
logged metrics (verl/trainer/ppo/metric_utils.py: compute_timing_metrics, compute_throughout_metrics;
tokens_per_s_per_gpu/step is VERL's perf/throughput, mfu/* its perf/mfu).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.phases import CHECKPOINT_BYTES, PHASE_KEYS
from trainer.workers.memory_peaks import GPU, MAX_ALLOCATED, MAX_RESERVED
from trainer.workers.phase_spans import WAIT_FIGURES, WORKERS

TIMING = "timing_s"
# A phase's rounds timed again at the end of the session when its gate failed on CPU workers
# ("retimed_s/<phase>"): evidence for that verdict (pytest_rlbench.verdict.judge), never judged on its own.
RETIMED = "retimed_s"
# One round of every gated phase in turn, pass after pass, at the end of a session on CPU workers
# ("side_by_side_s/<phase>", a round per pass): each phase timed beside its peers in the same seconds
# (pytest_rlbench.verdict.session_pace.SideBySide). Evidence, never judged on its own.
SIDE_BY_SIDE = "side_by_side_s"
TIMING_PER_TOKEN = "timing_per_token_ms"
THROUGHPUT = "tokens_per_s_per_gpu"
MFU = "mfu"
BANDWIDTH = "bandwidth_util"
# save_checkpoint's figure: the checkpoint's bytes over (seconds x devices), in GB/s. Its work is bytes,
# not tokens (trainer.phases.CHECKPOINT_BYTES: what a step that saves reports of its checkpoint).
WRITE_RATE = "checkpoint_gb_per_s_per_gpu"

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
            WRITE_RATE, "GB/s/GPU", higher_is_better=True, label="GB/s written per GPU", phases=("save_checkpoint",),
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
# A step's figures of each phase recorded as evidence beside the verdicts, never judged: family ->
# figure -> unit, each recorded as the run's metric <family>/<figure>/<phase>.
# - gpu: the phase's peak GPU memory, under the trainer's names (trainer/workers/memory_peaks.py), the GPU
#   family of pytest_rlbench.verdict.machine_load;
# - workers: the phase's time around its workers' own calls (trainer/workers/phase_spans.py).
STEP_EVIDENCE_FIGURES: dict[str, dict[str, str]] = {
    GPU: {MAX_ALLOCATED: "GiB", MAX_RESERVED: "GiB"},
    WORKERS: dict.fromkeys(WAIT_FIGURES, "s"),
}
# The bytes a save wrote (all files of the checkpoint), as a step or the save_checkpoint benchmark
# reports them: recorded as the run's metric checkpoint/bytes, the work behind the WRITE_RATE figure,
# never judged on its own (the checkpoint family: evidence, as the GPU family is).
CHECKPOINT = CHECKPOINT_BYTES.partition("/")[0]


def step_evidence_unit(name: str) -> str | None:
    """The unit of a step figure that STEP_EVIDENCE_FIGURES names (gpu/max_allocated_gib/update_actor,
    workers/start_lag_s/old_log_prob), else None."""
    family, figure, phase = (name.split("/") + ["", ""])[:3]
    return STEP_EVIDENCE_FIGURES.get(family, {}).get(figure) if phase in PHASE_KEYS else None


# What the slowest worker's set-up spent outside every phase, recorded as run metrics setup_s/<what>
# (seconds) from the workers' set-up reports (trainer/workers/train_worker.py): the rollout engine's
# warm-up (its kernels compiled before the first timed gen, as vLLM compiles and captures when its
# engine starts), the training phases' warm-up (their kernels compiled before their first timed call),
# cuDNN's attention plans for long packed rows (where a row can be long enough to attend alone) and the
# host memory pinned for offloaded optimizer state. Evidence, never judged.
SETUP = "setup_s"
SETUP_FIGURES: dict[str, str] = {  # metric -> worker key
    "rollout_warm_up": "rollout_warm_up_s",
    "training_warm_up": "training_warm_up_s",
    "row_plans": "row_plans_s",
    "pinning": "pinning_s",
}


def setup_figures(workers: list[dict]) -> dict[str, float]:
    """The metric ids and seconds of SETUP_FIGURES that any worker reported above 0: the largest of them."""
    out = {}
    for name, key in SETUP_FIGURES.items():
        seconds = [float(w[key]) for w in workers if w.get(key)]
        if seconds:
            out[f"{SETUP}/{name}"] = max(seconds)
    return out


# The rollout panel's figures (pytest_rlbench/session/rollout_panel.py): each --rl-rollout engine's
# throughput and fidelity, recorded as run metrics rollout_panel/<engine>/<figure>, never over gen's.
PANEL = "rollout_panel"
TOKENS_PER_S = "tokens_per_s"
# A panel figure's unit and direction: the throughput, then each step fidelity figure by its own name.
PANEL_FIGURES: dict[str, tuple[str, bool]] = {
    TOKENS_PER_S: ("tokens/s", True),
    **{name.partition("/")[2]: kind for name, kind in STEP_METRICS.items()},
}


def panel_metric(engine: str, figure: str) -> str:
    """The run metric id of one engine's figure: rollout_panel/<engine>/<figure>."""
    return f"{PANEL}/{engine}/{figure}"


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
        # a tiny model's MFU (1e-8 of the peak) is not 0.0%, which one decimal would print
        return "under 0.1%" if 0 < value < 0.0005 else f"{value:.1%}"
    return f"{_number(value)} {unit}".rstrip()
