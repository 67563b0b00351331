"""The summary's first lines: the answer to the question a run asks.

Gated: PASS or FAIL per gating baseline, one line each, naming the figures that failed. No gate:
that nothing passed or failed, and the command that would gate this work, built from the command
line the user gave: ``--rl-workload NAME`` where a baseline's recorded work, replayed on this kind of
hardware, would make it a gate; else saving this run as a baseline (``--rl-save-baseline``) and
gating later runs on it (``--rl-baseline``), or only the latter once this run saved one. Then the
run's efficiency where it means something: MFU and decode bandwidth use against this device's
peak, only where the peak is known (GPUs in ``verdict/peaks.py``; never a CPU).
"""

from __future__ import annotations

import shlex
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_rlbench.records.length_shapes import NATURAL
from pytest_rlbench.records.metrics import (
    BANDWIDTH,
    GPU,
    MAX_ALLOCATED,
    MAX_RESERVED,
    MFU,
    SETUP,
    SETUP_FIGURES,
    TIMING,
    WAIT_FIGURES,
    WORKERS,
    format_value,
    metric_label,
)
from pytest_rlbench.records.record import RunRecord
from pytest_rlbench.records.workload_replay import WorkloadError, workload_overrides
from pytest_rlbench.verdict.compare import JUDGED, BaselineComparison, hardware_mismatches
from pytest_rlbench.verdict.derived import derive
from pytest_rlbench.verdict.gate_basis import SAME_MACHINE, gpu_family, with_assumed_gpu
from pytest_rlbench.verdict.noise import DEFAULT_CPU_TOLERANCE
from pytest_rlbench.verdict.peaks import peak_bf16_flops
from pytest_rlbench.verdict.session_pace import MIN_PEERS, PACE_MIN_S
from trainer.phases import PHASE_KEYS

SUGGESTED_BASELINE = "rlbench-baseline.json"  # where the save suggestion writes, unless the user named a file
SAVE, GATE, REPLAY = "--rl-save-baseline", "--rl-baseline", "--rl-workload"
CONFIG = "--rl-config"
# The options a replay's suggested command leaves out, each where the replay sets the key beside it:
# --rl-model sets the model's path; a data set of one's own has its own prompt lengths, where the
# replay generates prompts at the baseline's (data.synthetic_prompt_length).
OPTION_KEYS = {"--rl-model": "actor_rollout_ref.model.path", "--rl-dataset": "data.synthetic_prompt_length"}


@dataclass(frozen=True)
class Invocation:
    """How this run was started, for the commands the answer suggests."""

    args: tuple[str, ...] = ()  # pytest's command-line arguments, as given
    save_path: Path | None = None  # --rl-save-baseline's file, if given
    saved: bool = False  # whether this run wrote it

    def command(self, *extra: str, without_keys: frozenset[str] = frozenset()) -> str:
        """This run's command with ``extra`` added, any --rl-save-baseline of its own left out, and any
        --rl-config setting a key of ``without_keys`` (or option of OPTION_KEYS beside one)."""
        kept = [arg for option in self.options() if not _drops(option, without_keys) for arg in option]
        return shlex.join(["pytest", *kept, *extra])

    def options(self) -> list[tuple[str, ...]]:
        """The arguments, each option with its value as one tuple ("--rl-config", "K=V")."""
        out: list[tuple[str, ...]] = []
        args = iter(self.args)
        for arg in args:
            valued = arg in (SAVE, CONFIG, *OPTION_KEYS)
            out.append((arg, next(args, "")) if valued else (arg,))
        return out

    def settings_of(self, keys: frozenset[str]) -> list[str]:
        """The settings this run gave that set one of ``keys``, as typed ("--rl-config K=V")."""
        return [" ".join(option) for option in self.options() if _drops(option, keys) and not _is_save(option)]


def _is_save(option: tuple[str, ...]) -> bool:
    return option[0] == SAVE or option[0].startswith(f"{SAVE}=")


def _drops(option: tuple[str, ...], keys: frozenset[str]) -> bool:
    """Whether a suggested command leaves ``option`` out: this run's own save, or a setting of ``keys``."""
    name, _, inline = option[0].partition("=")
    value = option[1] if len(option) > 1 else inline
    if name == CONFIG:
        return value.split("=", 1)[0].strip() in keys
    return _is_save(option) or OPTION_KEYS.get(name) in keys


def gate_status(result: BaselineComparison) -> str:
    """ "1 of 6 failed, 2 inconclusive, 3 phases not run": figures counted if judged, phases if not run."""
    judged = sum(c.verdict in JUDGED for c in result.comparisons)
    failed, unsure = len(result.failures), len(result.inconclusive)
    passed = judged - failed - unsure
    status = (
        f"{failed} of {judged} failed"
        if failed
        else f"all {judged} passed"
        if not unsure
        else f"{passed} of {judged} passed"
    )
    not_run = len({c.phase for c in result.comparisons if c.verdict == "not run"})
    phases = f", {not_run} phase{'s' if not_run > 1 else ''} not run" if not_run else ""
    return status + (f", {unsure} inconclusive" if unsure else "") + phases


def verdict_line(result: BaselineComparison, framework: str = "") -> str:
    """One gate's answer: "FAIL  baseline 'ci': 1 of 9 failed (update_actor seconds)"."""
    who = f"{framework}: " if framework else ""
    failed = ", ".join(dict.fromkeys(metric_label(c.metric) for c in result.failures))
    return f"{'FAIL' if failed else 'PASS'}  {who}baseline '{result.baseline}': {gate_status(result)}" + (
        f" ({failed})" if failed else ""
    )


# A gated CPU session whose long phases ran at under this fraction of the baseline's times (their
# median ratio) says so beside its verdict: the session's pace only excuses a slower host, so against a
# baseline saved in a slower session a phase's regression up to that difference passes unseen
# (docs/benchmarks.md, "The median block"). 1 / 1.15: past the default CPU tolerance.
FASTER_SESSION_BELOW = round(1 / (1 + DEFAULT_CPU_TOLERANCE), 2)


def faster_session_note(run: RunRecord, result: BaselineComparison) -> str | None:
    """A line where a CPU session ran markedly faster than the baseline it was gated on, else None."""
    if result.mode != "gate" or result.basis != SAME_MACHINE or run.hardware.device != "cpu":
        return None
    ratios = [
        c.ratio for c in result.comparisons
        if c.metric.startswith(f"{TIMING}/") and c.verdict in JUDGED and c.ratio and (c.baseline or 0) >= PACE_MIN_S
    ]
    if len(ratios) <= MIN_PEERS:
        return None
    pace = statistics.median(ratios)
    if pace >= FASTER_SESSION_BELOW:
        return None
    hidden = (1 + DEFAULT_CPU_TOLERANCE) / pace - 1
    return (
        f"note: this session ran faster than baseline '{result.baseline}' (its phases at {pace:.2f}x the "
        f"baseline's times, median of {len(ratios)}): a phase up to about {hidden:.0%} slower than its peers "
        "would still pass; if this machine usually runs this fast, save the baseline again"
    )


def _replay_gate(run: RunRecord, baseline: RunRecord, result: BaselineComparison) -> str | None:
    """What replaying ``baseline``'s recorded work here would gate, or None when it would not gate."""
    w = baseline.workload
    if w is None or NATURAL in (w.prompt_length.shape.value, w.response_length.shape.value):
        return None  # nothing to replay, or work the model decides (never the same twice)
    if any(m.startswith("framework:") for m in result.mismatches):
        return None  # another framework's run stays a reference
    try:
        settings = workload_overrides(baseline, run.hardware.world_size)
    except WorkloadError:
        return None  # its work per GPU does not divide over this run's workers
    model_set = any(s.key == "actor_rollout_ref.model.path" for s in settings)
    if not model_set and any(m.startswith("model:") for m in result.mismatches):
        return None  # no preset has its model: the replay would run another model
    # the hardware read directly: a comparison whose work differs lists the work's differences, not the
    # hardware's (an H200 run against an H100 baseline read "its times, on this same machine")
    baseline = with_assumed_gpu(baseline)
    if not hardware_mismatches(run, baseline):
        return "its times, on this same machine"
    ours, theirs = run.hardware, baseline.hardware
    if ours.device != "gpu" or theirs.device != "gpu" or not ours.gpu_model or not theirs.gpu_model:
        return None  # a published GPU run never gates a CPU run, nor the other way round
    if gpu_family(ours.gpu_model) == gpu_family(theirs.gpu_model):
        return "its per-GPU throughput"
    return "its MFU and bandwidth use" if peak_bf16_flops(ours.gpu_model) is not None else None


def _size(record: RunRecord) -> int:
    m = record.model
    return m.num_layers * m.hidden_size * m.intermediate_size


def replay_candidates(
    run: RunRecord, baselines: Sequence[RunRecord], results: Sequence[BaselineComparison]
) -> list[tuple[str, str]]:
    """(baseline name, what it would gate) for each reference whose replayed work would gate here:
    those of this run's model first, then the smaller models (a larger one may not fit)."""
    by_name = {r.baseline: r for r in results if r.mode != "gate"}
    found = [
        (b, gated)
        for b in baselines
        if b.name in by_name and (gated := _replay_gate(run, b, by_name[b.name])) is not None
    ]
    found.sort(key=lambda pair: (pair[0].model.name != run.model.name, _size(pair[0])))
    return [(b.name, gated) for b, gated in found]


def advice_lines(
    run: RunRecord,
    baselines: Sequence[RunRecord],
    results: Sequence[BaselineComparison],
    invocation: Invocation,
) -> list[str]:
    """No gate: that nothing passed or failed, and the command that would gate this work."""
    if invocation.saved and invocation.save_path is not None:
        path = str(invocation.save_path)
        return [
            f"NO GATE in this run, which saved a baseline: gate later runs on it with  {invocation.command(GATE, path)}"
        ]
    replaying = any(a == REPLAY or a.startswith(f"{REPLAY}=") for a in invocation.args)
    candidates = [] if replaying else replay_candidates(run, baselines, results)
    if candidates:
        name, gated = candidates[0]
        others = ", ".join(n for n, _ in candidates[1:])
        # what the replay sets, this run's own settings of it left out: set on top, they would make
        # the replay's work differ from the baseline's, and the suggested run would gate nothing
        baseline = next(b for b in baselines if b.name == name)
        settings = workload_overrides(baseline, run.hardware.world_size)
        keys = frozenset(s.key for s in settings if not s.places_memory)  # placed otherwise, it still gates
        lines = [
            f"NO GATE: to gate against '{name}' ({gated}), replay its work per GPU:  "
            f"{invocation.command(REPLAY, name, without_keys=keys)}"
        ]
        if dropped := invocation.settings_of(keys):
            lines.append(f"  (left out: {', '.join(dropped)}: the replay sets these keys to what '{name}' did)")
        return lines + ([f"  ({others} the same way)"] if others else [])
    path = str(invocation.save_path or SUGGESTED_BASELINE)
    return [
        f"NO GATE: save this run as this machine's baseline with  {invocation.command(SAVE, path)}",
        f"  then gate later runs on it with  {invocation.command(GATE, path)}",
        "  (no baseline did this run's work on this kind of hardware, so nothing passed or failed)",
    ]


def efficiency_line(run: RunRecord) -> list[str]:
    """The run's MFU and decode bandwidth use against its device's peak; nothing where no peak is known."""
    figures = [f for f in derive(run).values() if f.family in (MFU, BANDWIDTH) and f.value is not None]
    if not figures:
        return []
    parts = ", ".join(f"{metric_label(f.metric)} {format_value(f.value, f.unit)}" for f in figures)
    return [f"efficiency against the peak of {run.hardware.gpu_model}: {parts}"]


def memory_line(run: RunRecord) -> list[str]:
    """Each phase's peak GPU memory on the GPU that held the most, in the round that held the most (what
    must fit), as whole steps of the bundled trainer report it; nothing where none was (CPU)."""
    parts = []
    for phase in PHASE_KEYS:
        allocated = run.metrics.get(f"{GPU}/{MAX_ALLOCATED}/{phase}")
        reserved = run.metrics.get(f"{GPU}/{MAX_RESERVED}/{phase}")
        if allocated is not None and reserved is not None:
            parts.append(f"{phase} {max(allocated.value):.1f}/{max(reserved.value):.1f}")
    return [f"peak GPU memory per GPU (largest round), GiB allocated/reserved: {', '.join(parts)}"] if parts else []


WAITS_SHOWN_FROM_S = 0.1  # a phase is named where the driver's share or the workers' spread reaches this


def waits_line(run: RunRecord) -> list[str]:
    """How whole steps' phases on the workers (trainer/workers/phase_spans.py) spent time around the
    workers' own calls, each figure the most of any round: until the last worker began (the driver
    preparing and sending the parts, Ray scheduling the call) and after the last one ended (the results'
    way back, the driver assembling them), which lengthen the phase; and how far apart the workers
    ended (uneven work, or GPUs of unequal speed). Phases under WAITS_SHOWN_FROM_S in both are left off."""
    parts = []
    for phase in PHASE_KEYS:
        series = [run.metrics.get(f"{WORKERS}/{figure}/{phase}") for figure in WAIT_FIGURES]  # lag, spread, back
        if any(m is None for m in series):
            continue
        lag, spread, back = (max(m.value) for m in series)
        if lag + back >= WAITS_SHOWN_FROM_S or spread >= WAITS_SHOWN_FROM_S:
            parts.append(f"{phase} {lag:.2f} until the last worker began + {back:.2f} after the last ended, "
                         f"workers' ends {spread:.2f} apart")
    if not parts:
        return []
    return [f"around the workers' calls (whole steps; seconds, the most of any round): {'; '.join(parts)}"]


# Each SETUP_FIGURES metric in the summary's words, {s} its seconds.
SETUP_WORDS = {
    "rollout_warm_up": "rollout warm-up {s:.1f} s (its kernels compiled before the first gen, as vLLM's are when it starts)",
    "training_warm_up": "training warm-up {s:.1f} s (old_log_prob's, ref's and update_actor's kernels compiled "
    "before their first call)",
    "row_plans": "cuDNN's attention plans for long packed rows built in {s:.1f} s (one for each width a row "
    "attending alone can take)",
    "pinning": "host memory pinned for the optimizer state in {s:.1f} s",
}


def setup_line(run: RunRecord) -> list[str]:
    """What the slowest worker's set-up spent outside every timed phase (SETUP_FIGURES); nothing where
    it spent none (CPU workers, no offloaded optimizer state)."""
    figures = {name: run.metrics.get(f"{SETUP}/{name}") for name in SETUP_FIGURES}
    parts = [SETUP_WORDS[name].format(s=max(m.value)) for name, m in figures.items() if m is not None]
    return [f"set-up, outside every timed phase: {'; '.join(parts)}"] if parts else []


def answer_lines(
    outcomes: Sequence[tuple[RunRecord, Sequence[BaselineComparison]]],
    baselines: Sequence[RunRecord] = (),
    invocation: Invocation | None = None,
) -> list[str]:
    """The summary's first lines for each framework's (run, results): its gates' verdicts, or with
    no gate in any, what would gate this work; then each run's efficiency."""
    several = len(outcomes) > 1
    lines = [
        line
        for run, results in outcomes
        for r in results
        if r.mode == "gate"
        for line in (verdict_line(r, (run.provenance.framework or "") if several else ""), faster_session_note(run, r))
        if line is not None
    ]
    if not lines and outcomes and any(results for _, results in outcomes):
        run, results = outcomes[0]
        lines = advice_lines(run, baselines, results, invocation or Invocation())
    return lines + [
        line for run, _ in outcomes for line in (*efficiency_line(run), *memory_line(run), *waits_line(run), *setup_line(run))
    ]
