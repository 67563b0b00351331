"""A PNG of one step's phase breakdown: this run beside each baseline of the same model.

Only baselines of the run's model (the same architecture and dtype) are drawn: seconds of another
model's step say nothing about this one's, so those are named in a note under the chart instead. Each
bar's label gives its hardware and its per-GPU work (sequences per GPU, mean response length) and says
whether that is the run's own per-GPU work, whether the baseline is a gate or a reference only, and
what the bar is: one measured step, or phases timed apart and summed.

Every bar is one measured step where there is one: the run's is the whole-step round of median step
time, split by that round's own phase times (``step_breakdown``, the rounds ``rl_bench`` records
under ``breakdown=``); a published baseline's phase times are one step's. A record without either (a
run of the phase benchmarks only, or a saved pytest-rlbench baseline) is drawn from its separately
timed phases and labelled so.

Left panel: seconds per step on a log axis, so a run and a baseline 30x longer are both readable; one
stacked horizontal bar per record, phases in the order of the phase keys (trainer.phases.PHASE_KEYS).
Right panel: the same bars as fractions of the step, so runs on different hardware can be compared by
shape. Phases nested in gen (generate_sequences, reshard) are drawn as parts of gen; time inside the
step that no phase accounts for is drawn as "other". save_checkpoint runs outside the step and is left
out. A phase that failed its gate gets a red edge and a red cross (legend "failed: <phase>"); a
reference-only baseline is drawn faded. Drawn on matplotlib's Agg canvas: no display needed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_rlbench.records.record import RunRecord
from pytest_rlbench.records.workload import model_differences, workload_matches, workload_tokens
from pytest_rlbench.verdict.compare import BaselineComparison

GEN_PARTS: tuple[str, ...] = ("generate_sequences", "reshard")
TOP_LEVEL: tuple[str, ...] = ("reward", "old_log_prob", "ref", "adv", "update_actor")
OTHER = "other"
GEN_REST = "gen (rest)"
MEASURED_STEP = "one measured step"
PHASES_APART = "phases timed apart, summed"
OWN_FRAMEWORK = "pytest-rlbench"  # provenance.framework of records this plugin wrote
FAILED_COLOUR = "#c53030"
REFERENCE_ALPHA = 0.45

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
}


def _median(record: RunRecord, key: str) -> float | None:
    phase = record.phases.get(key)
    return statistics.median(phase.seconds) if phase is not None else None


def breakdown_segments(seconds: Mapping[str, float]) -> list[tuple[str, float]]:
    """(label, seconds) of one step's parts from its seconds by phase key, in the phase keys' order."""
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


def record_step(record: RunRecord, rounds: Sequence[Mapping[str, float]] = ()) -> tuple[list[tuple[str, float]], str]:
    """A record's bar and what it is: one measured step where there is one (see the module docstring)."""
    measured = median_step_round(rounds)
    if measured is not None:
        return breakdown_segments(measured), MEASURED_STEP
    apart = record.provenance.framework == OWN_FRAMEWORK
    return step_segments(record), PHASES_APART if apart else MEASURED_STEP


def nothing_to_draw(
    run: RunRecord, baselines: Sequence[RunRecord] = (), step_breakdown: Sequence[Mapping[str, float]] = ()
) -> str | None:
    """Why the chart would have no bar (no part of a step timed by the run or a baseline of its model), or
    None when there is something to draw: a run of save_checkpoint alone times nothing inside the step."""
    drawn, _ = drawn_baselines(run, baselines)
    if record_step(run, step_breakdown)[0] or any(record_step(b)[0] for b in drawn):
        return None
    timed = ", ".join(run.phases) or "none"
    return f"no phase inside the step was timed (timed: {timed}), and no baseline of this model to draw"


def failed_phases(results: Sequence[BaselineComparison]) -> list[str]:
    """The phases with a failed gate comparison, in the order first met."""
    return list(dict.fromkeys(c.phase for r in results for c in r.failures if c.phase))


def _hardware_label(record: RunRecord) -> str:
    hw = record.hardware
    nodes = f"{hw.nodes} node{'s' if hw.nodes != 1 else ''}"
    if hw.device == "cpu":
        return f"CPU, {nodes}, {hw.world_size} rank(s)"
    model = hw.gpu_model.removeprefix("NVIDIA ") if hw.gpu_model else "GPUs (model unknown)"
    return f"{nodes} x {hw.gpus_per_node} {model}"


def drawn_baselines(run: RunRecord, baselines: Sequence[RunRecord]) -> tuple[list[RunRecord], list[str]]:
    """(the baselines of the run's model, a note for each other one: left off the chart)."""
    drawn, notes = [], []
    for b in baselines:
        if model_differences(run.model, b.model):
            notes.append(f"{b.name} ({b.model.name}: another model than this run's)")
        else:
            drawn.append(b)
    return drawn, notes


def work_label(record: RunRecord, run: RunRecord | None = None) -> str:
    """A record's per-GPU work in a few words; beside ``run``, whether it is the run's own."""
    tokens = workload_tokens(record)
    sequences = tokens.num_sequences or (tokens.response_lengths and len(tokens.response_lengths))
    mean = tokens.response_length_mean
    if mean is None and tokens.response_lengths:
        mean = sum(tokens.response_lengths) / len(tokens.response_lengths)
    per_gpu = f"{sequences / record.hardware.world_size:g} seq/GPU" if sequences else "seq/GPU unknown"
    text = per_gpu + (f", response {mean:,.0f} tokens" if mean is not None else "")
    if run is None:
        return text
    return text + ("; same per-GPU work" if not workload_matches(run, record) else "; other per-GPU work")


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


def _row_label(record: RunRecord, run: RunRecord, kind: str, role: str | None) -> str:
    """Name, hardware, per-GPU work; then what the bar is, and for a baseline whether it gates."""
    if record is run:
        return f"{record.name} (this run)\n{_hardware_label(record)}\n{work_label(record)}\n{kind}"
    what = {"gate": "gate", "reference": "reference only, not a gate"}.get(role or "", "baseline")
    return f"{record.name}\n{_hardware_label(record)}\n{work_label(record, run)}\n{kind}; {what}"


def _draw_bar(
    ax_abs: Axes, ax_rel: Axes, y: int, segments: Sequence[tuple[str, float]], limits: tuple[float, float], faded: bool
) -> None:
    """One record's bar in both panels; ``limits`` the log axis' (low, high), for where labels fit."""
    total, left = sum(v for _, v in segments), 0.0
    decades = math.log10(limits[1] / limits[0])
    for label, seconds in segments:
        colour, hatch = COLOURS[label], "//" if label == OTHER else None
        style = {"color": colour, "edgecolor": "white", "linewidth": 0.8, "hatch": hatch}
        style["alpha"] = REFERENCE_ALPHA if faded else 1.0
        shown_left = max(left, limits[0])  # on a log axis a bar from 0 starts at the axis' edge
        ax_abs.barh(y, left + seconds - shown_left, left=shown_left, **style)
        if seconds > 0 and math.log10((left + seconds) / shown_left) >= 0.12 * decades:  # wide enough to hold it
            text = f"{seconds:,.0f} s" if seconds >= 10 else f"{seconds:.2g} s"
            ax_abs.text(math.sqrt(shown_left * (left + seconds)), y, text, ha="center", va="center", fontsize=8,
                        color=_text_colour(colour))
        share = seconds / total if total else 0.0
        ax_rel.barh(y, share, left=left / total if total else 0.0, **style)
        if share >= 0.07:
            ax_rel.text((left + seconds / 2) / total, y, f"{share:.0%}", ha="center", va="center", fontsize=8,
                        color=_text_colour(colour))
        left += seconds
    note = f"{total:,.1f} s" if segments else "no step phases timed"
    ax_abs.text(max(total, limits[0]), y, f"  {note}", va="center", fontsize=9, color="#2d3748")


def _log_limits(rows: Sequence[tuple[RunRecord, list[tuple[str, float]], str]]) -> tuple[float, float]:
    """The log axis' range: from a tenth of the shortest first part or step to 3x the longest step (room
    for its total), so the shortest bar still spans a decade."""
    bars = [segments for _, segments, _ in rows if segments]
    totals = [sum(v for _, v in s) for s in bars]
    if not totals or max(totals) <= 0:
        return 0.1, 10.0
    firsts = [s[0][1] for s in bars if s[0][1] > 0]
    return max(min(firsts + totals) / 10, 1e-6), max(totals) * 3


def _mark_failures(
    ax: Axes, y: int, segments: Sequence[tuple[str, float]], failed: Sequence[str], floor: float
) -> list[str]:
    """A red cross and outline on each failed phase of the run's bar; returns the failed phases not drawn."""
    missing = []
    for phase in failed:
        span = _segment_span(segments, phase)
        if span is None:
            missing.append(phase)
            continue
        low, high = max(span[0], floor), span[1]
        ax.barh(y, high - low, left=low, fill=False, edgecolor=FAILED_COLOUR, linewidth=2.2)
        # On the bar's top edge, so that the cross hides no segment's label; a failed step at the bar's end.
        x = high if phase == "step" else math.sqrt(low * high)
        ax.plot([x], [y - 0.4], marker="X", markersize=9, linestyle="none", color=FAILED_COLOUR,
                markeredgecolor="white", label=f"failed: {phase}")
    return missing


def draw_chart(
    run: RunRecord,
    baselines: Sequence[RunRecord] = (),
    results: Sequence[BaselineComparison] = (),
    step_breakdown: Sequence[Mapping[str, float]] = (),
) -> Figure:
    """The chart as a matplotlib Figure on an Agg canvas (see the module docstring).

    ``results``: the comparisons with the baselines (which gate, which failed); ``step_breakdown``: the
    run's whole-step rounds, seconds by phase key."""
    # matplotlib is imported here, not with the plugin: every pytest start would pay for it otherwise.
    # A Figure with the Agg canvas draws without pyplot, so no global backend is set for the user.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.ticker import PercentFormatter

    drawn, left_off = drawn_baselines(run, baselines)
    roles = {r.baseline: r.mode for r in results}
    rows = [(run, *record_step(run, step_breakdown))] + [(b, *record_step(b)) for b in drawn]
    height = 2.4 + 1.1 * len(rows)
    fig = Figure(figsize=(13, height))
    FigureCanvasAgg(fig)
    ax_abs, ax_rel = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [3, 2]})
    used = {label for _, segments, _ in rows for label, _ in segments}
    limits = _log_limits(rows)
    for y, (record, segments, _) in enumerate(rows):
        _draw_bar(ax_abs, ax_rel, y, segments, limits, faded=roles.get(record.name) == "reference")
    not_drawn = _mark_failures(ax_abs, 0, rows[0][1], failed_phases(results), limits[0])
    if not_drawn:
        left_off.append(f"failed, not in the step's bar: {', '.join(not_drawn)}")
    labels = [_row_label(record, run, kind, roles.get(record.name)) for record, _, kind in rows]
    ax_abs.set_yticks(range(len(rows)), labels, fontsize=8)
    ax_abs.get_yticklabels()[0].set_fontweight("bold")
    ax_abs.invert_yaxis()  # this run on top
    ax_abs.set_xscale("log")
    ax_abs.set_xlim(*limits)
    ax_abs.set_xlabel("seconds per step (log scale)")
    ax_rel.set_xlabel("share of the step")
    ax_rel.set_xlim(0, 1)
    ax_rel.xaxis.set_major_formatter(PercentFormatter(1.0))
    for ax in (ax_abs, ax_rel):
        ax.spines[["top", "right"]].set_visible(False)
        ax.grid(axis="x", color="#edf2f7", linewidth=0.8)
        ax.set_axisbelow(True)
    ax_abs.set_title("Time per step, by phase (log scale)", loc="left", fontsize=11)
    ax_rel.set_title("Same, as fractions of the step", loc="left", fontsize=11)
    handles = [Patch(facecolor=COLOURS[k], hatch="//" if k == OTHER else None, label=k) for k in COLOURS if k in used]
    crosses = [h for h in ax_abs.get_lines() if h.get_label().startswith("failed: ")]
    if crosses:  # one legend entry for every cross, naming the phases
        from matplotlib.lines import Line2D

        names = ", ".join(h.get_label().removeprefix("failed: ") for h in crosses)
        handles.append(Line2D([], [], marker="X", color=FAILED_COLOUR, linestyle="none", label=f"failed gate: {names}"))
    fig.suptitle(f"Step phase breakdown: {run.name} and {len(drawn)} baseline(s) of the same model",
                 x=0.01, ha="left", fontsize=12, fontweight="bold")
    note_room = 0.3 / height if left_off else 0.0  # inches for the note under the legend
    if handles:  # none when no bar has a part (nothing_to_draw says why)
        fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, note_room), ncol=min(len(handles), 10),
                   frameon=False, fontsize=9)
    if left_off:
        note = "Not drawn: " + "; ".join(left_off)
        fig.text(0.01, 0.01, note, ha="left", va="bottom", fontsize=8, color="#4a5568")
    fig.tight_layout(rect=(0, 0.6 / height + note_room, 1, 1))
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
