"""A PNG of one step's phase breakdown: this run beside each baseline of the same model.

Only baselines of the run's model (the same architecture and dtype) are drawn: seconds of another
model's step say nothing about this one's, so those are named in a note under the chart instead.

Bars are drawn in two groups, and a bar is only ever set beside bars of the same kind of figure:

- "one measured step": a whole step, timed as one. The run's is the whole-step round of median step
  time (``step_breakdown``, the rounds ``rl_bench`` records under ``breakdown=``), split by that
  round's own phase times, its length the step's time as the summary gives it; a published baseline's
  phase times are one step's. A baseline saved by this plugin keeps no per-round split, so its step
  is drawn whole ("step, not split").
- "phases timed apart, summed": each phase's median time from its own benchmark, stacked. The run's
  and those of the baselines saved by this plugin (a published baseline has none of this kind).
  Where they are fewer than the phases of the same record's measured step (a run narrowed with -k),
  the label says how many of the step's phases they sum and which are not in it.

Where the summary judged a phase's time against a baseline, the bars take the summary's figures (the
run's, and the baseline's as the verdict read it: on CPU workers its median block of rounds), so the
chart and the table show the same seconds; otherwise a record's median. Each bar's label gives its
hardware and per-GPU work, for a baseline whether that is the run's work (a gate's comparison decides
this), and whether the baseline is a gate or a reference only.

Left panel: seconds per step on a linear axis (stacked segments keep their true lengths). Right
panel: the same bars as fractions of their total, so runs on different hardware can be compared by
shape. Phases nested in gen (generate_sequences, reshard) are drawn as parts of gen; time inside a
measured step that no phase accounts for is drawn as "other". save_checkpoint runs outside the step
and is left out (a step whose rounds also saved is recorded less its saves). A phase that
failed its gate gets a red edge and a red cross on the run's bar that holds the judged figure: the
step's on the measured step, any other phase's on the phases timed apart (legend "failed gate:
<phases> (<reason>)", the phases grouped by the reason of their first failure, such as "slower"
or "slower beside its peers"); an inconclusive one a dashed amber edge; one that passed on its counted work though its
time was past the tolerance (the machine ran slower) a dotted grey edge; a reference-only baseline
is drawn faded.
The legend and the note under the chart are sized to fit inside the figure. Drawn on matplotlib's Agg
canvas: no display needed.
"""

from __future__ import annotations

import statistics
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_rlbench.frameworks import OURS_LABEL
from pytest_rlbench.records.length_shapes import NATURAL
from pytest_rlbench.records.metrics import TIMING, family_of
from pytest_rlbench.records.record import RunRecord
from pytest_rlbench.records.workload import model_differences, workload_matches, workload_tokens
from pytest_rlbench.records.workload_replay import decode_replicas
from pytest_rlbench.verdict.compare import BaselineComparison
from pytest_rlbench.verdict.gate_basis import SAME_MACHINE
from pytest_rlbench.verdict.retiming import baseline_median

GEN_PARTS: tuple[str, ...] = ("generate_sequences", "reshard")
TOP_LEVEL: tuple[str, ...] = ("reward", "old_log_prob", "ref", "adv", "update_actor")
OTHER = "other"
GEN_REST = "gen (rest)"
WHOLE_STEP = "step, not split"  # a measured step whose record keeps no split by phase
MEASURED_STEP = "one measured step"
PHASES_APART = "phases timed apart, summed"
KINDS: tuple[str, ...] = (MEASURED_STEP, PHASES_APART)  # the groups, top to bottom
OWN_SOURCE = "pytest-rlbench"  # how provenance.source of any record this plugin wrote begins (TRL's too)
FAILED_COLOUR = "#c53030"
INCONCLUSIVE_COLOUR = "#d69e2e"
SAME_WORK_COLOUR = "#4a5568"
# How a judged phase is outlined on the run's bar: (edge colour, line style).
MARKS: dict[str, tuple[str, str]] = {
    "failed": (FAILED_COLOUR, "-"),
    "inconclusive": (INCONCLUSIVE_COLOUR, "--"),
    "same work": (SAME_WORK_COLOUR, ":"),
}
REFERENCE_ALPHA = 0.45
FIGURE_WIDTH = 13.0  # inches

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# Generation in blues, log-probs in greens, the update in orange: families read at a glance.
COLOURS: dict[str, str] = {
    "generate_sequences": "#2b6cb0",
    "reshard": "#90cdf4",
    "gen": "#4299e1",
    GEN_REST: "#bee3f8",
    "reward": "#805ad5",
    "old_log_prob": "#2f855a",
    "ref": "#68d391",
    "adv": "#a0aec0",
    "update_actor": "#dd6b20",
    OTHER: "#e2e8f0",
    WHOLE_STEP: "#4a5568",
}


@dataclass(frozen=True)
class Bar:
    """One drawn bar: whose, which kind of figure, its (label, seconds) parts, and the baseline's
    comparison with the run (None for the run, or when no comparison was given)."""

    record: RunRecord
    kind: str
    segments: list[tuple[str, float]]
    result: BaselineComparison | None = None

    @property
    def total(self) -> float:
        return sum(v for _, v in self.segments)


def _median(record: RunRecord, key: str) -> float | None:
    phase = record.phases.get(key)
    return statistics.median(phase.seconds) if phase is not None else None


def breakdown_segments(seconds: Mapping[str, float]) -> list[tuple[str, float]]:
    """(label, seconds) of one step's parts from its seconds by phase key, in the phase keys' order;
    with "step" given, the step's time that no part accounts for is "other"."""
    out: list[tuple[str, float]] = [(k, seconds[k]) for k in GEN_PARTS if k in seconds]
    gen = seconds.get("gen")
    if gen is not None:
        rest = gen - sum(v for _, v in out)
        if not out:
            out.append(("gen", gen))
        elif rest > 0:
            out.append((GEN_REST, rest))
    out += [(k, seconds[k]) for k in TOP_LEVEL if k in seconds]
    step = seconds.get("step")
    if step is not None and step > sum(v for _, v in out):
        out.append((OTHER, step - sum(v for _, v in out)))
    return out


def step_segments(record: RunRecord) -> list[tuple[str, float]]:
    """(label, seconds) of one step's parts from the record's median phase times; only parts timed."""
    return breakdown_segments({k: v for k in record.phases if (v := _median(record, k)) is not None})


def median_step_round(rounds: Sequence[Mapping[str, float]]) -> Mapping[str, float] | None:
    """The whole-step round of median step time (the lower of the two middle ones), or None."""
    timed = sorted((r for r in rounds if "step" in r), key=lambda r: r["step"])
    return timed[(len(timed) - 1) // 2] if timed else None


def timed_apart(record: RunRecord) -> bool:
    """Whether the record's phases were timed apart, each by its own benchmark (a record this plugin
    wrote), rather than inside one step (a published run's)."""
    return record.provenance.framework == OURS_LABEL or record.provenance.source.startswith(OWN_SOURCE)


def summary_seconds(results: Sequence[BaselineComparison], baseline: str | None = None) -> dict[str, float]:
    """Each phase's seconds as the summary gives them: the run's (``baseline`` None) or that
    baseline's side of its comparison (as the verdict read it)."""
    out: dict[str, float] = {}
    for result in results:
        if baseline is not None and result.baseline != baseline:
            continue
        for c in result.comparisons:
            value = c.measured if baseline is None else c.baseline
            if family_of(c.metric) == TIMING and c.phase and value is not None:
                out.setdefault(c.phase, value)
    return out


def _phases_apart(record: RunRecord, figures: Mapping[str, float], baseline: bool) -> list[tuple[str, float]]:
    """The phases inside the step, stacked: the summary's figure where it has one, else the median (a
    baseline's of its median block of rounds, as a verdict reads it)."""
    seconds = {}
    for key in (*GEN_PARTS, "gen", *TOP_LEVEL):
        if key in record.phases and record.phases[key].inside_step:
            continue  # its time is the measured step's bar's, not a phase timed apart
        if key in figures:
            seconds[key] = figures[key]
        elif key in record.phases:
            seconds[key] = baseline_median(record, key) if baseline else _median(record, key)
    return breakdown_segments(seconds)


def run_bars(
    run: RunRecord, rounds: Sequence[Mapping[str, float]] = (), results: Sequence[BaselineComparison] = ()
) -> list[Bar]:
    """The run's bars: its measured step (the median whole-step round, split by its own phases, as long
    as the summary's step time) and its phases timed apart; each where timed."""
    figures = summary_seconds(results)
    bars = []
    step = figures.get("step", _median(run, "step"))
    measured = median_step_round(rounds)
    if measured is not None:
        parts = {k: v for k, v in measured.items() if k != "step"}
        bars.append(Bar(run, MEASURED_STEP, breakdown_segments({**parts, "step": step or measured["step"]})))
    elif step is not None:
        bars.append(Bar(run, MEASURED_STEP, [(WHOLE_STEP, step)]))
    apart = _phases_apart(run, figures, baseline=False)
    if apart:
        bars.append(Bar(run, PHASES_APART, apart))
    return bars


def _median_round_split(record: RunRecord) -> dict[str, float]:
    """A record saved from a session of whole steps keeps each phase timed inside them (inside_step),
    one sample per step round: the split of its median step round (the lower of the two middle ones)."""
    step = record.phases.get("step")
    inside = {k: p.seconds for k, p in record.phases.items() if p.inside_step}
    if step is None or not inside or any(len(v) != len(step.seconds) for v in inside.values()):
        return {}
    rounds = [{"step": s, **{k: v[i] for k, v in inside.items()}} for i, s in enumerate(step.seconds)]
    middle = median_step_round(rounds)
    assert middle is not None  # the step has rounds
    return {k: v for k, v in middle.items() if k != "step"}


def baseline_bars(baseline: RunRecord, result: BaselineComparison | None = None) -> list[Bar]:
    """A baseline's bars: a published run's one measured step (its phases are that step's); a saved
    run's measured step (split by the phases timed inside it, where it kept them; else whole) and its
    phases timed apart."""
    if not timed_apart(baseline):
        segments = step_segments(baseline)
        return [Bar(baseline, MEASURED_STEP, segments, result)] if segments else []
    figures = summary_seconds([result], baseline.name) if result is not None else {}
    bars = []
    if "step" in figures or "step" in baseline.phases:
        step = figures.get("step") or baseline_median(baseline, "step")
        split = _median_round_split(baseline)
        segments = breakdown_segments({**split, "step": step}) if split else [(WHOLE_STEP, step)]
        bars.append(Bar(baseline, MEASURED_STEP, segments, result))
    apart = _phases_apart(baseline, figures, baseline=True)
    if apart:
        bars.append(Bar(baseline, PHASES_APART, apart, result))
    return bars


def chart_bars(
    run: RunRecord,
    baselines: Sequence[RunRecord] = (),
    results: Sequence[BaselineComparison] = (),
    step_breakdown: Sequence[Mapping[str, float]] = (),
) -> list[Bar]:
    """Every bar, grouped by kind (``KINDS``), the run's first in each group."""
    drawn, _ = drawn_baselines(run, baselines)
    by_name = {r.baseline: r for r in results}
    bars = run_bars(run, step_breakdown, results)
    for b in drawn:
        bars += baseline_bars(b, by_name.get(b.name))
    return sorted(bars, key=lambda bar: KINDS.index(bar.kind))  # stable: the run first, then the baselines


def nothing_to_draw(
    run: RunRecord, baselines: Sequence[RunRecord] = (), step_breakdown: Sequence[Mapping[str, float]] = ()
) -> str | None:
    """Why the chart would have no bar (no part of a step timed by the run or a baseline of its model), or
    None when there is something to draw: a run of save_checkpoint alone times nothing inside the step."""
    if chart_bars(run, baselines, step_breakdown=step_breakdown):
        return None
    timed = ", ".join(run.phases) or "none"
    return f"no phase inside the step was timed (timed: {timed}), and no baseline of this model to draw"


def failure_reasons(results: Sequence[BaselineComparison]) -> dict[str, str]:
    """Each phase with a failed gate comparison and the reason of its first failure, in the order first met."""
    reasons: dict[str, str] = {}
    for result in results:
        for c in result.failures:
            if c.phase:
                reasons.setdefault(c.phase, c.reason)
    return reasons


def failed_phases(results: Sequence[BaselineComparison]) -> list[str]:
    """The phases with a failed gate comparison, in the order first met."""
    return list(failure_reasons(results))


def failed_label(phases: Sequence[str], reasons: Mapping[str, str]) -> str:
    """The legend's text for the red crosses: the phases grouped by why they failed, so a failure the bars
    cannot show (slower only beside its peers, more counted work) is read off the chart too."""
    by_reason: dict[str, list[str]] = {}
    for phase in phases:
        by_reason.setdefault(reasons.get(phase) or "failed", []).append(phase)
    groups = "; ".join(f"{', '.join(names)} ({reason})" for reason, names in by_reason.items())
    return f"failed gate: {groups}"


def inconclusive_phases(results: Sequence[BaselineComparison]) -> list[str]:
    """The phases with an inconclusive gate comparison and none failed, in the order first met."""
    failed = failed_phases(results)
    return list(
        dict.fromkeys(c.phase for r in results for c in r.inconclusive if c.phase and c.phase not in failed)
    )


def same_work_phases(results: Sequence[BaselineComparison]) -> list[str]:
    """The phases that passed on their counted work (reason "same work": time past the tolerance, the
    same ops and FLOPs) and were neither failed nor inconclusive anywhere, in the order first met."""
    marked = set(failed_phases(results)) | set(inconclusive_phases(results))
    return list(
        dict.fromkeys(
            c.phase
            for r in results
            for c in r.comparisons
            if c.verdict == "pass" and c.reason == "same work" and c.phase and c.phase not in marked
        )
    )


def _hardware_label(record: RunRecord) -> str:
    hw = record.hardware
    nodes = f"{hw.nodes} node{'s' if hw.nodes != 1 else ''}"
    if hw.device == "cpu":
        return f"CPU, {nodes}, {hw.world_size} rank(s)"
    assumed = record.workload.gpu_model if record.workload is not None else None
    if hw.gpu_model:
        model = hw.gpu_model.removeprefix("NVIDIA ")
    else:
        model = f"GPUs ({assumed.value} assumed)" if assumed is not None else "GPUs (model unknown)"
    tp, assumed_tp = _rollout_tp(record)
    shown = f", rollout TP {tp}" + (" assumed" if assumed_tp else "") if tp > 1 else ""
    return f"{nodes} x {hw.gpus_per_node} {model}{shown}"


def _rollout_tp(record: RunRecord) -> tuple[int, bool]:
    """The GPUs that decoded one share together, and whether that is assumed: a run's config says
    (rollout_tp); a published run's workload, as the gate reads it (workload_replay.decode_replicas:
    its rollout_tp, or a tp that names no rollout, as RLinf's "tp": 2, taken as one); else 1."""
    tp = record.config.parallelism.get("rollout_tp")
    if tp is not None:
        return int(tp), False
    if record.workload is None:
        return 1, False
    replicas, assumption = decode_replicas(record)
    return record.hardware.world_size // replicas, assumption is not None


def drawn_baselines(run: RunRecord, baselines: Sequence[RunRecord]) -> tuple[list[RunRecord], list[str]]:
    """(the baselines of the run's model, a note for each other one: left off the chart)."""
    drawn, notes = [], []
    for b in baselines:
        if model_differences(run.model, b.model):
            notes.append(f"{b.name} ({b.model.name}: another model than this run's)")
        else:
            drawn.append(b)
    return drawn, notes


def work_label(
    record: RunRecord, run: RunRecord | None = None, result: BaselineComparison | None = None
) -> str:
    """A record's per-GPU work in a few words; beside ``run``, whether it is the run's own: a gate's
    comparison (``result``) decides that, having found the same work; otherwise the workloads."""
    tokens = workload_tokens(record)
    sequences = tokens.num_sequences or (tokens.response_lengths and len(tokens.response_lengths))
    mean = tokens.response_length_mean
    if mean is None and tokens.response_lengths:
        mean = sum(tokens.response_lengths) / len(tokens.response_lengths)
    per_gpu = f"{sequences / record.hardware.world_size:g} seq/GPU" if sequences else "seq/GPU unknown"
    text = per_gpu + (f", response {mean:,.0f} tokens" if mean is not None else "")
    drawn = record.workload.response_length if record.workload is not None else None
    generated = generated_response_mean(record)
    if drawn is not None and drawn.shape.value != NATURAL and drawn.mean.value and generated is not None:
        # The rows a replay generated are a draw, the slowest shares' heavier than the mean: named
        # where they differ from the workload's mean by more than 1%.
        if abs(generated / drawn.mean.value - 1) > 0.01:
            text += f" (its rows: {generated:,.0f})"
    if run is None:
        return text
    if result is not None and result.mode == "gate":
        return text + (
            "; same work, same hardware" if result.basis == SAME_MACHINE else "; same per-GPU work"
        )
    return text + ("; same per-GPU work" if not workload_matches(run, record) else "; other per-GPU work")


def generated_response_mean(record: RunRecord) -> float | None:
    """The mean response length of the rows the record's rounds generated (its step's, else its
    gen's per-round token counts), or None where it has none."""
    for phase in ("step", "gen"):
        timed = record.phases.get(phase)
        rounds = [t for t in (timed.round_tokens or []) if t.response_tokens and t.num_sequences] if timed else []
        if rounds:
            return sum(t.response_tokens for t in rounds) / sum(t.num_sequences for t in rounds)
    return None


def _text_colour(fill: str) -> str:
    """White on dark fills, near-black on light ones."""
    r, g, b = (int(fill[i : i + 2], 16) for i in (1, 3, 5))
    return "white" if 0.299 * r + 0.587 * g + 0.114 * b < 150 else "#1a202c"


def chart_path_for(report_path: str | Path) -> Path:
    """Where the chart goes: beside the JSON report, same name, .png."""
    return Path(report_path).with_suffix(".png")


def _segment_span(segments: Sequence[tuple[str, float]], phase: str) -> tuple[float, float] | None:
    """(left, right) seconds of a phase's part of a bar: gen spans its nested parts, step the bar."""
    left, spans = 0.0, {}
    for label, seconds in segments:
        spans[label] = (left, left + seconds)
        left += seconds
    if phase == "step" and segments:
        return 0.0, left
    parts = [spans[k] for k in (*GEN_PARTS, GEN_REST, "gen") if k in spans] if phase == "gen" else []
    if parts:
        return parts[0][0], parts[-1][1]
    return spans.get(phase)


def role_of(result: BaselineComparison | None) -> str:
    """What a baseline is to this run, as its label says it."""
    if result is None:
        return "baseline"
    return "gate" if result.mode == "gate" else "reference only, not a gate"


def step_phases(segments: Sequence[tuple[str, float]]) -> list[str]:
    """The step's phases a bar's parts hold, gen's parts counted as gen; "other" and a step not split
    are none."""
    names = ["gen" if label in (*GEN_PARTS, GEN_REST) else label for label, _ in segments]
    return list(dict.fromkeys(n for n in names if n not in (OTHER, WHOLE_STEP)))


def kind_text(bar: Bar, step_bar: Bar | None) -> str:
    """What the bar is. Phases timed apart that are fewer than those of the same record's measured
    step (a run narrowed with -k) say so, as their sum is not then comparable with the step."""
    if bar.kind != PHASES_APART or step_bar is None:
        return bar.kind
    summed, in_step = step_phases(bar.segments), step_phases(step_bar.segments)
    missing = [p for p in in_step if p not in summed]
    if not missing:
        return bar.kind
    note = f"only {len(summed)} of the step's {len(in_step)} phases, not {', '.join(missing)}"
    return "\n".join([f"{bar.kind}:", *textwrap.wrap(note, 40)])


def _row_label(bar: Bar, run: RunRecord, step_bar: Bar | None = None) -> str:
    """Name, hardware, per-GPU work; then what the bar is, and for a baseline whether it gates."""
    record, kind = bar.record, kind_text(bar, step_bar)
    if record is run:
        return f"{record.name} (this run)\n{_hardware_label(record)}\n{work_label(record)}\n{kind}"
    work = work_label(record, run, bar.result)
    return f"{record.name}\n{_hardware_label(record)}\n{work}\n{kind}; {role_of(bar.result)}"


def _seconds_text(seconds: float) -> str:
    return f"{seconds:,.0f} s" if seconds >= 10 else f"{seconds:.3g} s"


def _draw_bar(ax_abs: Axes, ax_rel: Axes, y: int, bar: Bar, x_max: float, ratio: str) -> None:
    """One bar in both panels; ``x_max`` the seconds axis' right end, for where a label fits."""
    total, left = bar.total, 0.0
    faded = bar.result is not None and bar.result.mode == "reference"
    for label, seconds in bar.segments:
        colour, hatch = COLOURS[label], "//" if label == OTHER else None
        style = {"color": colour, "edgecolor": "white", "linewidth": 0.8, "hatch": hatch}
        style["alpha"] = REFERENCE_ALPHA if faded else 1.0
        ax_abs.barh(y, seconds, left=left, **style)
        if seconds >= 0.08 * x_max:  # wide enough to hold its label
            ax_abs.text(
                left + seconds / 2,
                y,
                _seconds_text(seconds),
                ha="center",
                va="center",
                fontsize=8,
                color=_text_colour(colour),
            )
        if label != WHOLE_STEP:  # a step not split has no shares to show
            share = seconds / total if total else 0.0
            ax_rel.barh(y, share, left=left / total if total else 0.0, **style)
            if share >= 0.07:
                ax_rel.text(
                    (left + seconds / 2) / total,
                    y,
                    f"{share:.0%}",
                    ha="center",
                    va="center",
                    fontsize=8,
                    color=_text_colour(colour),
                )
        left += seconds
    if [label for label, _ in bar.segments] == [WHOLE_STEP]:
        ax_rel.text(
            0.01,
            y,
            "not split by phase (the record keeps no per-round split)",
            va="center",
            fontsize=8,
            color="#4a5568",
        )
    ax_abs.text(total, y, f"  {_seconds_text(total)}{ratio}", va="center", fontsize=9, color="#2d3748")


def _ratio_text(bar: Bar, run_bar: Bar | None) -> str:
    """Beside a baseline's bar: the run's total over its, as the summary states a time's ratio."""
    if bar.record is (run_bar.record if run_bar else None) or run_bar is None or not bar.total:
        return ""
    return f"  (this run: {run_bar.total / bar.total:.2f}x)"


def _mark_phases(
    ax: Axes, run: RunRecord, rows: Sequence[Bar], phases: Sequence[str], mark: str
) -> list[str]:
    """Outline each of ``phases`` on the run's bar that holds the figure its gate judged: a step on the
    measured step, any other phase on the phases timed apart (its own benchmark timed it). A failed
    phase gets a red edge and a red cross, the others their ``MARKS`` edge. Returns the phases not drawn
    (a custom metric's, or a part no bar has)."""
    run_rows = {bar.kind: (y, bar) for y, bar in enumerate(rows) if bar.record is run}
    colour, style = MARKS[mark]
    failed = mark == "failed"
    missing = []
    for phase in phases:
        timed = run.phases.get(phase)
        in_step = phase == "step" or (timed is not None and timed.inside_step)  # its figure is the step's
        preferred = (MEASURED_STEP, PHASES_APART) if in_step else (PHASES_APART, MEASURED_STEP)
        found = [
            (y, span)
            for kind in preferred
            if kind in run_rows
            for y, bar in [run_rows[kind]]
            if (span := _segment_span(bar.segments, phase)) is not None
        ]
        if not found:
            missing.append(phase)
            continue
        y, (low, high) = found[0]
        outline = ax.barh(
            y,
            high - low,
            left=low,
            fill=False,
            edgecolor=colour,
            linewidth=2.2,
            linestyle=style,
        )
        outline.patches[0].set_gid(f"{mark}: {phase}")  # for tests to find
        if failed:  # on the bar's top edge, so that the cross hides no label; a failed step at the bar's end
            x = high if phase == "step" else (low + high) / 2
            ax.plot(
                [x],
                [y - 0.4],
                marker="X",
                markersize=9,
                linestyle="none",
                color=colour,
                markeredgecolor="white",
                label=f"failed: {phase}",
            )
    return missing


def _fit_legend_and_note(fig: Figure, handles: list, note: str | None) -> float:
    """The legend and the note at the figure's foot, each made to fit its width (the legend in fewer
    columns, the note wrapped); returns the height they take, as a fraction of the figure's."""
    renderer = fig.canvas.get_renderer()
    width, height = fig.bbox.width, fig.bbox.height
    margin = 0.01
    bottom = margin
    if note:
        text = fig.text(margin, margin, note, ha="left", va="bottom", fontsize=8, color="#4a5568")
        for chars in range(len(note), 20, -10):
            text.set_text(textwrap.fill(note, chars))
            if text.get_window_extent(renderer).width <= width * (1 - 2 * margin):
                break
        bottom += text.get_window_extent(renderer).height / height + margin
    if handles:  # none when no bar has a part (nothing_to_draw says why)
        for ncol in range(min(len(handles), 10), 0, -1):
            legend = fig.legend(
                handles=handles,
                loc="lower center",
                bbox_to_anchor=(0.5, bottom),
                ncol=ncol,
                frameon=False,
                fontsize=9,
            )
            if legend.get_window_extent(renderer).width <= width * (1 - 2 * margin) or ncol == 1:
                break
            legend.remove()
        bottom += legend.get_window_extent(renderer).height / height
    return bottom + margin


def draw_chart(
    run: RunRecord,
    baselines: Sequence[RunRecord] = (),
    results: Sequence[BaselineComparison] = (),
    step_breakdown: Sequence[Mapping[str, float]] = (),
) -> Figure:
    """The chart as a matplotlib Figure on an Agg canvas (see the module docstring).

    ``results``: the comparisons with the baselines (which gate, which failed, the summary's seconds);
    ``step_breakdown``: the run's whole-step rounds, seconds by phase key."""
    # matplotlib is imported here, not with the plugin: every pytest start would pay for it otherwise.
    # A Figure with the Agg canvas draws without pyplot, so no global backend is set for the user.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import PercentFormatter

    drawn, left_off = drawn_baselines(run, baselines)
    rows = chart_bars(run, baselines, results, step_breakdown)
    height = 2.8 + 1.0 * max(len(rows), 1)
    fig = Figure(figsize=(FIGURE_WIDTH, height))
    FigureCanvasAgg(fig)
    ax_abs, ax_rel = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [3, 2]})
    x_max = max((bar.total for bar in rows), default=1.0) or 1.0
    run_bar = {bar.kind: bar for bar in rows if bar.record is run}
    for y, bar in enumerate(rows):
        _draw_bar(ax_abs, ax_rel, y, bar, x_max, _ratio_text(bar, run_bar.get(bar.kind)))
    for y in range(1, len(rows)):  # a rule between the groups of one kind
        if rows[y].kind != rows[y - 1].kind:
            for ax in (ax_abs, ax_rel):
                ax.axhline(y - 0.5, color="#a0aec0", linewidth=0.8, linestyle="--")
    failed, inconclusive = failed_phases(results), inconclusive_phases(results)
    not_drawn = _mark_phases(ax_abs, run, rows, failed, "failed") if rows else failed
    if not_drawn:
        left_off.append(f"failed, not in the run's bars: {', '.join(not_drawn)}")
    drawn_inconclusive = [
        p for p in inconclusive if p not in _mark_phases(ax_abs, run, rows, inconclusive, "inconclusive")
    ]
    same_work = same_work_phases(results)
    drawn_same_work = [p for p in same_work if p not in _mark_phases(ax_abs, run, rows, same_work, "same work")]
    measured = {id(bar.record): bar for bar in rows if bar.kind == MEASURED_STEP}
    labels = [_row_label(bar, run, measured.get(id(bar.record))) for bar in rows]
    ax_abs.set_yticks(range(len(rows)), labels, fontsize=8)
    for y, tick in enumerate(ax_abs.get_yticklabels()):
        if rows[y].record is run:
            tick.set_fontweight("bold")
    ax_abs.set_ylim(max(len(rows), 1) - 0.5, -0.5)  # this run on top of each group
    ax_abs.set_xlim(0, x_max * 1.3)  # room for the totals
    ax_abs.set_xlabel("seconds per step")
    ax_rel.set_xlabel("share of the bar")
    ax_rel.set_xlim(0, 1)
    ax_rel.xaxis.set_major_formatter(PercentFormatter(1.0))
    for ax in (ax_abs, ax_rel):
        ax.spines[["top", "right"]].set_visible(False)
        ax.grid(axis="x", color="#edf2f7", linewidth=0.8)
        ax.set_axisbelow(True)
    ax_abs.set_title("Time per step, by phase", loc="left", fontsize=11)
    ax_rel.set_title("Same, as fractions of each bar", loc="left", fontsize=11)
    used = {label for bar in rows for label, _ in bar.segments}
    handles = [
        Patch(facecolor=COLOURS[k], hatch="//" if k == OTHER else None, label=k) for k in COLOURS if k in used
    ]
    crosses = [
        h.get_label().removeprefix("failed: ")
        for h in ax_abs.get_lines()
        if h.get_label().startswith("failed: ")
    ]
    if crosses:  # one legend entry for every cross, naming the phases
        label = failed_label(list(dict.fromkeys(crosses)), failure_reasons(results))
        handles.append(Line2D([], [], marker="X", color=FAILED_COLOUR, linestyle="none", label=label))
    outlined = (
        ("inconclusive", drawn_inconclusive, "inconclusive"),  # past tolerance, the session could not tell
        ("same work", drawn_same_work, "passed on counted work (the machine ran slower)"),
    )
    for mark, names, label in outlined:
        if names:
            colour, style = MARKS[mark]
            handles.append(
                Patch(fill=False, edgecolor=colour, linestyle=style, linewidth=2, label=f"{label}: {', '.join(names)}")
            )
    beside = (
        f"beside {len(drawn)} baseline(s) of the same model" if drawn else "alone (no baseline of this model)"
    )
    fig.suptitle(
        f"Step phase breakdown: {run.name} {beside}", x=0.01, ha="left", fontsize=12, fontweight="bold"
    )
    note = "Not drawn: " + "; ".join(left_off) if left_off else None
    bottom = _fit_legend_and_note(fig, handles, note)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    return fig


def write_chart(
    path: str | Path,
    run: RunRecord,
    baselines: Sequence[RunRecord] = (),
    dpi: int = 120,
    results: Sequence[BaselineComparison] = (),
    step_breakdown: Sequence[Mapping[str, float]] = (),
) -> Path:
    """Draw the chart (``draw_chart``) to ``path`` (a PNG); return the path."""
    path = Path(path)
    fig = draw_chart(run, baselines, results, step_breakdown)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path
